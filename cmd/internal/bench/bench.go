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

// Config configures a run; cmd/outbox-bench's flags set every field (their
// help says what each means). The fields with a JSON name are the report's
// "config".
type Config struct {
	DB         string `json:"db"`     // sqlite, postgres or mysql
	Broker     string `json:"broker"` // kfake, kfake-process or real
	N          int    `json:"n"`      // drain: rows of the raw loop and each relay count
	NaiveN     int    `json:"naive_n"`
	ValueSize  int    `json:"value_size"`
	Buckets    int    `json:"buckets"`
	Partitions int    `json:"partitions"`
	BatchSize  int    `json:"batch_size"` // the relays' and the raw loop's
	Relays     []int  `json:"relays"`     // drain: relay counts
	// MaxConcurrentBuckets is the relays' Options.MaxConcurrentBuckets (0:
	// the library default).
	MaxConcurrentBuckets int `json:"max_concurrent_buckets"`
	// MaxIdleConns is SetMaxIdleConns of every pool (0: database/sql's 2,
	// below what a relay serving several buckets at once keeps busy: its
	// connections then close and reopen between statements).
	MaxIdleConns int      `json:"max_idle_conns"`
	Scenarios    []string `json:"scenarios"`

	DSN     string   `json:"-"` // the server of postgres or mysql: a fresh database is created on it and dropped
	Brokers []string `json:"-"` // the real or kfake-process broker

	Rates           []int         `json:"-"` // latency: commits per second
	LatencyDuration time.Duration `json:"-"` // latency: measured, after a warm-up of a tenth (at most 1s)
	LatencyModes    []string      `json:"-"` // latency: local, poll, pgnotify
	EnqueueTx       int           `json:"-"` // enqueue: transactions per variant
	IdleWindow      time.Duration `json:"-"` // idle: counting window per fleet
	IdleFleets      []int         `json:"-"` // idle: relay counts

	// Logger receives progress; RelayLogger, when set, every log of the
	// drain relays and their stores (DEBUG: each batch's times), else their
	// warnings go to Logger.
	Logger      *slog.Logger `json:"-"`
	RelayLogger *slog.Logger `json:"-"`
}

func (c Config) validate() error {
	for _, s := range c.Scenarios {
		if !slices.Contains(AllScenarios(), s) {
			return fmt.Errorf("bench: unknown scenario %q (want one of %v)", s, AllScenarios())
		}
	}
	for _, v := range []struct {
		name string
		v    int
	}{{"N", c.N}, {"NaiveN", c.NaiveN}, {"ValueSize", c.ValueSize}, {"Buckets", c.Buckets}, {"Partitions", c.Partitions}, {"BatchSize", c.BatchSize}, {"EnqueueTx", c.EnqueueTx}, {"MaxConcurrentBuckets", c.MaxConcurrentBuckets}, {"MaxIdleConns", c.MaxIdleConns}} {
		if v.v < 0 {
			return fmt.Errorf("bench: Config.%s %d is negative", v.name, v.v)
		}
	}
	return nil
}

// Report is the result of a run; it marshals to the JSON the command writes.
type Report struct {
	Started   time.Time       `json:"started"`
	Machine   Machine         `json:"machine"`
	Config    Config          `json:"config"`
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

// Run runs the configured scenarios and returns their results. It fails on
// setup errors and on a scenario that does not complete (rows left behind,
// ids never consumed); it never judges timings.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	start := time.Now()
	e, err := newEnv(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer e.close()
	rep := &Report{
		Started:   start.UTC(),
		Machine:   Machine{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, NumCPU: runtime.NumCPU(), GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0)},
		Config:    cfg,
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
			rep.Idle, err = each(e.cfg.IdleFleets, func(n int) (IdleResult, error) { return e.idle(ctx, n) })
		}
		if err != nil {
			return rep, fmt.Errorf("bench: %s: %w", s, err)
		}
	}
	rep.Seconds = time.Since(start).Seconds()
	return rep, nil
}

// each runs f on every x and collects the results, up to the first error.
func each[T any](xs []int, f func(int) (T, error)) ([]T, error) {
	out := make([]T, 0, len(xs))
	for _, x := range xs {
		r, err := f(x)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}
