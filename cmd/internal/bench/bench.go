// Package bench is the benchmark harness behind cmd/outbox-bench: drain
// throughput against two baselines (a raw select-produce-delete loop and a
// naive one-row SELECT … FOR UPDATE SKIP LOCKED relay), commit→ack and
// commit→consume latency at a steady commit rate, enqueue overhead, the
// idle cost of a relay fleet in statements per second, and scaling with the
// relay count. Every scenario runs on one fresh database and one broker, so
// the ratios compare like with like. Timings are reported, never asserted.
package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"time"
)

// Scenario names.
const (
	ScenarioDrain   = "drain"
	ScenarioLatency = "latency"
	ScenarioEnqueue = "enqueue"
	ScenarioIdle    = "idle"
)

// AllScenarios returns every scenario, in the order a default run executes
// them.
func AllScenarios() []string {
	return []string{ScenarioEnqueue, ScenarioIdle, ScenarioLatency, ScenarioDrain}
}

// Config configures a run. A zero field means its default.
type Config struct {
	// DB is sqlite, postgres or mysql. Empty means sqlite.
	DB string
	// DSN is the server DSN for postgres or mysql; the harness creates a
	// fresh database on that server and drops it at the end.
	DSN string
	// Broker is kfake (in-process), kfake-process (kfake in a process of
	// its own, at Brokers) or real. Empty means kfake.
	Broker string
	// Brokers are the bootstrap addresses of a real or kfake-process broker.
	Brokers []string
	// Scenarios to run. Nil means AllScenarios.
	Scenarios []string

	// N is the number of preloaded rows of the drain scenario: the raw loop
	// and every relay count drain N rows. Zero means 200,000.
	N int
	// NaiveN is the number of rows the naive one-row relay drains (it is two
	// orders of magnitude slower). Zero means min(N, 3,000).
	NaiveN int
	// ValueSize is the record value size in bytes. Zero means 1024.
	ValueSize int
	// Buckets is the outbox bucket count. Zero means 8.
	Buckets int
	// Partitions is the topic partition count. Zero means 8.
	Partitions int
	// BatchSize is the relay's (and the raw loop's) batch size. Zero means 500.
	BatchSize int
	// Relays are the relay counts of the drain scenario (scaling). Nil means
	// [1].
	Relays []int
	// MaxConcurrentBuckets is every relay's Options.MaxConcurrentBuckets.
	// Zero means the library default (relay.DefaultMaxConcurrentBuckets).
	MaxConcurrentBuckets int
	// MaxIdleConns is SetMaxIdleConns of every pool the harness opens
	// through GORM (relays, writers, baselines). Zero keeps database/sql's
	// default of 2, below what a relay serving several buckets at once
	// (fetch, publish, delete beside the next fetch, renewals) keeps busy:
	// its connections then close and reopen between statements.
	MaxIdleConns int

	// Rates are the commit rates (per second) of the latency scenario. Nil
	// means [100, 1000].
	Rates []int
	// LatencyDuration is how long each latency run commits and measures,
	// after a warm-up of a tenth of it (at most 1s) that is not measured.
	// Zero means 10s.
	LatencyDuration time.Duration
	// LatencyModes are the notification modes: local, poll, pgnotify. Nil
	// means all three (pgnotify only on PostgreSQL).
	LatencyModes []string

	// EnqueueTx is the number of transactions per enqueue variant. Zero
	// means 2,000.
	EnqueueTx int

	// IdleWindow is how long the idle scenario counts statements, after a
	// warm-up. Zero means 30s.
	IdleWindow time.Duration
	// IdleFleets are the relay counts of the idle scenario. Nil means [1, 3].
	IdleFleets []int

	// Logger receives progress logs. Nil means slog.Default().
	Logger *slog.Logger
	// RelayLogger, when set, receives every log of the drain relays and
	// their stores (each with a "relay" attribute), DEBUG included with a
	// handler that enables it: the per-batch fetch, publish and delete
	// times. Nil: their warnings and errors go to Logger.
	RelayLogger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	if c.DB == "" {
		c.DB = "sqlite"
	}
	if c.Broker == "" {
		c.Broker = "kfake"
	}
	if c.Scenarios == nil {
		c.Scenarios = AllScenarios()
	}
	for _, s := range c.Scenarios {
		if !slices.Contains(AllScenarios(), s) {
			return c, fmt.Errorf("bench: unknown scenario %q (want one of %v)", s, AllScenarios())
		}
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.N, 200_000)
	def(&c.NaiveN, min(c.N, 3_000))
	def(&c.ValueSize, 1024)
	def(&c.Buckets, 8)
	def(&c.Partitions, 8)
	def(&c.BatchSize, 500)
	def(&c.EnqueueTx, 2_000)
	if c.Relays == nil {
		c.Relays = []int{1}
	}
	if c.Rates == nil {
		c.Rates = []int{100, 1000}
	}
	if c.LatencyDuration == 0 {
		c.LatencyDuration = 10 * time.Second
	}
	if c.LatencyModes == nil {
		c.LatencyModes = []string{ModeLocal, ModePoll, ModePgNotify}
	}
	if c.IdleWindow == 0 {
		c.IdleWindow = 30 * time.Second
	}
	if c.IdleFleets == nil {
		c.IdleFleets = []int{1, 3}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	for _, v := range []struct {
		name string
		v    int
	}{{"N", c.N}, {"NaiveN", c.NaiveN}, {"ValueSize", c.ValueSize}, {"Buckets", c.Buckets}, {"Partitions", c.Partitions}, {"BatchSize", c.BatchSize}, {"EnqueueTx", c.EnqueueTx}, {"MaxConcurrentBuckets", c.MaxConcurrentBuckets}, {"MaxIdleConns", c.MaxIdleConns}} {
		if v.v < 0 {
			return c, fmt.Errorf("bench: Config.%s %d is negative", v.name, v.v)
		}
	}
	for _, r := range slices.Concat(c.Relays, c.Rates, c.IdleFleets) {
		if r <= 0 {
			return c, errors.New("bench: relay counts and rates must be positive")
		}
	}
	return c, nil
}

// Report is the result of a run; it marshals to the JSON the command writes.
type Report struct {
	Started   time.Time       `json:"started"`
	Machine   Machine         `json:"machine"`
	Config    ReportConfig    `json:"config"`
	Drain     []DrainResult   `json:"drain,omitempty"`
	Latency   []LatencyResult `json:"latency,omitempty"`
	Enqueue   []EnqueueResult `json:"enqueue,omitempty"`
	Idle      []IdleResult    `json:"idle,omitempty"`
	Notes     []string        `json:"notes,omitempty"`
	Seconds   float64         `json:"seconds"`
	DBVersion string          `json:"db_version"`
}

// Machine describes where the run happened.
type Machine struct {
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	NumCPU     int    `json:"num_cpu"`
	GoVersion  string `json:"go_version"`
	GOMAXPROCS int    `json:"gomaxprocs"`
}

// ReportConfig is the effective configuration of a run.
type ReportConfig struct {
	DB         string `json:"db"`
	Broker     string `json:"broker"`
	N          int    `json:"n"`
	NaiveN     int    `json:"naive_n"`
	ValueSize  int    `json:"value_size"`
	Buckets    int    `json:"buckets"`
	Partitions int    `json:"partitions"`
	BatchSize  int    `json:"batch_size"`
	Relays     []int  `json:"relays"`
	// MaxConcurrentBuckets is the relays' Options.MaxConcurrentBuckets
	// (0: the library default).
	MaxConcurrentBuckets int `json:"max_concurrent_buckets"`
	// MaxIdleConns is the pools' SetMaxIdleConns (0: database/sql's 2).
	MaxIdleConns int      `json:"max_idle_conns"`
	Scenarios    []string `json:"scenarios"`
}

// Run runs the configured scenarios and returns their results. It fails on
// setup errors and on a scenario that does not complete (rows left behind,
// ids never consumed); it never judges timings.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	e, err := newEnv(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer e.close()
	rep := &Report{
		Started: start.UTC(),
		Machine: Machine{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, NumCPU: runtime.NumCPU(), GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0)},
		Config: ReportConfig{DB: cfg.DB, Broker: cfg.Broker, N: cfg.N, NaiveN: cfg.NaiveN, ValueSize: cfg.ValueSize,
			Buckets: cfg.Buckets, Partitions: cfg.Partitions, BatchSize: cfg.BatchSize, Relays: cfg.Relays, MaxConcurrentBuckets: cfg.MaxConcurrentBuckets, MaxIdleConns: cfg.MaxIdleConns, Scenarios: cfg.Scenarios},
		DBVersion: e.version,
	}
	for _, s := range cfg.Scenarios {
		cfg.Logger.Info("bench: scenario", "scenario", s, "db", cfg.DB, "broker", cfg.Broker)
		var err error
		switch s {
		case ScenarioDrain:
			rep.Drain, err = runDrain(ctx, e)
		case ScenarioLatency:
			rep.Latency, err = runLatency(ctx, e, rep)
		case ScenarioEnqueue:
			rep.Enqueue, err = runEnqueue(ctx, e)
		case ScenarioIdle:
			rep.Idle, err = runIdle(ctx, e)
		}
		if err != nil {
			return rep, fmt.Errorf("bench: %s: %w", s, err)
		}
	}
	rep.Seconds = time.Since(start).Seconds()
	return rep, nil
}
