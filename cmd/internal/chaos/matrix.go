package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/testenv"
)

// Timing of every harness relay: short leases so that takeovers happen
// within seconds of wall-clock time.
const (
	leaseDuration = 3 * time.Second
	renewInterval = time.Second
	pollInterval  = 200 * time.Millisecond
	batchSize     = 100
	partitions    = 8
	bucketCount   = outbox.DefaultBucketCount
)

// MatrixStep is one row of the crash matrix: a step of the relay's life and
// the failpoints that SIGKILL the relay there.
type MatrixStep struct {
	// Name describes the step.
	Name string
	// Failpoints is the OUTBOX_FAILPOINTS value armed in the victim.
	Failpoints string
	// PeerAfterKill starts the peer of a peer-takeover cell only once the
	// victim is killed, so that the victim owns every bucket until then
	// (the step needs the poison row's bucket).
	PeerAfterKill bool
}

// MatrixSteps returns the steps of the crash matrix.
func MatrixSteps() []MatrixStep {
	return []MatrixStep{
		{"after fetch, before publish", "relay/after-fetch=kill@3", false},
		{"during publish (appended, no answer yet)", "relay/during-publish=kill@3", false},
		{"after ack, before delete", "relay/after-ack=kill@3", false},
		{"during delete", "relay/during-delete=killafter(1ms)@3", false},
		{"during lease acquisition", "relay/acquire=kill@1", false},
		{"during renewal (slow publish)", "relay/during-publish=sleep(2500ms);relay/renew=kill@1", false},
		{"before parking (lease checked, statement not sent)", "relay/before-park=kill@1", true},
	}
}

// Recovery modes of the crash matrix.
const (
	// ModeRestart restarts the killed relay with the same relay id (a pod
	// restarted with a stable name): it finds its own leases.
	ModeRestart = "restart"
	// ModePeer lets a peer started beside the victim take over once the
	// victim's leases expire.
	ModePeer = "peer takeover"
)

// MatrixConfig configures CrashMatrix.
type MatrixConfig struct {
	Env
	// Messages is the number of messages per cell. Zero means 3000.
	Messages int
	// Transactional runs the transactional variant (see txn.go).
	Transactional bool
}

// MatrixRow is the outcome of one cell of the crash matrix.
type MatrixRow struct {
	Step, Failpoints, Mode string
	Messages               int
	Lost, Duplicates       int
	OrderViolations        int
	// The transactional variant (else -1): per-key inversions without
	// deduplication, and those of them no batch published again explains.
	RawOrderViolations, UnexplainedOrderViolations int
	// Resumed is the time from the kill until the first record of the
	// victim's buckets was produced again; negative when no row was left to
	// publish after the kill.
	Resumed time.Duration
	// PoisonParked: the cell's poison row was seen parked before its repair
	// and requeue.
	PoisonParked bool
}

// CrashMatrix runs every step in both modes and returns the rows.
func CrashMatrix(ctx context.Context, cfg MatrixConfig) ([]MatrixRow, error) {
	orDefault(&cfg.Messages, 3000)
	orDefault(&cfg.Logger, slog.Default())
	fake, err := startKfake(&cfg.Brokers)
	if err != nil {
		return nil, err
	}
	if fake != nil {
		defer fake.Close()
	}
	var rows []MatrixRow
	for i, s := range MatrixSteps() {
		for _, mode := range []string{ModeRestart, ModePeer} {
			row, err := crashCell(ctx, cfg, fmt.Sprintf("%d%c", i, mode[0]), s, mode)
			if err != nil {
				return rows, fmt.Errorf("chaos: %s, %s: %w", s.Name, mode, err)
			}
			cfg.Logger.Info("chaos: crash cell", "step", s.Name, "mode", mode, "lost", row.Lost, "duplicates", row.Duplicates, "order_violations", row.OrderViolations, "resumed", row.Resumed, "poison_parked", row.PoisonParked)
			rows = append(rows, row)
		}
	}
	return rows, nil
}

func crashCell(ctx context.Context, cfg MatrixConfig, cell string, step MatrixStep, mode string) (MatrixRow, error) {
	row := MatrixRow{Step: step.Name, Failpoints: step.Failpoints, Mode: mode, Messages: cfg.Messages, Resumed: -1, RawOrderViolations: -1, UnexplainedOrderViolations: -1}
	d, err := CreateDatabase(ctx, cfg.Dialect, cfg.BaseDSN, cfg.Dir)
	if err != nil {
		return row, err
	}
	defer d.Drop(ctx)
	topic := testenv.Unique("chaos_matrix_")
	if err := CreateTopic(ctx, cfg.Brokers, topic, partitions); err != nil {
		return row, err
	}
	cctx, cancel := context.WithCancel(ctx)
	consumer := startChecker(cctx, cfg.Transactional, cfg.Brokers, topic, partitions)
	defer consumer.Wait()
	defer cancel()
	db, err := openWriters(cfg.Dialect, d.DSN, 4)
	if err != nil {
		return row, err
	}
	defer closeGorm(db)
	perKey := map[string][]string{}
	var all []string
	enqueue := func(msgs []*outbox.Message) error {
		if err := db.Transaction(func(tx *gorm.DB) error { return outbox.Enqueue(tx, msgs...) }); err != nil {
			return err
		}
		for _, m := range msgs {
			perKey[string(m.Key)] = append(perKey[string(m.Key)], m.MessageID.String())
			all = append(all, m.MessageID.String())
		}
		return nil
	}
	// The poison key: a head row beyond the relays' BatchBytes, which they
	// park, and rows behind it; after the kill it is repaired and requeued.
	msgs := []*outbox.Message{outbox.NewStringMessage(topic, poisonKey, poisonHead)}
	for i := range 3 {
		msgs = append(msgs, outbox.NewStringMessage(topic, poisonKey, fmt.Sprint(i)))
	}
	if err := enqueue(msgs); err != nil {
		return row, err
	}
	head := msgs[0].ID
	for start := 0; start < cfg.Messages; start += 100 {
		msgs = nil
		for i := start; i < min(start+100, cfg.Messages); i++ {
			msgs = append(msgs, outbox.NewStringMessage(topic, fmt.Sprintf("k%02d", i%40), fmt.Sprint(i)))
		}
		if err := enqueue(msgs); err != nil {
			return row, err
		}
	}

	relays := cfg.relays(RelayConfig{DSN: d.DSN, TxnOutbox: txnOutbox(cfg.Transactional, topic)})
	defer relays.StopAll(10 * time.Second)
	victimID, peerID := "victim-"+cell, "peer-"+cell
	victim, err := relays.Start(victimID, "OUTBOX_FAILPOINTS="+step.Failpoints)
	if err != nil {
		return row, err
	}
	if mode == ModePeer && !step.PeerAfterKill {
		time.Sleep(300 * time.Millisecond)
		if _, err := relays.Start(peerID); err != nil {
			return row, err
		}
	}
	select {
	case <-victim.Done():
	case <-time.After(60 * time.Second):
		return row, errors.New("the failpoint never fired")
	case <-ctx.Done():
		return row, ctx.Err()
	}
	killedAt := victim.ExitedAt
	if victim.ExitSignal() != syscall.SIGKILL {
		return row, fmt.Errorf("victim exited with %v, not SIGKILL", victim.Err)
	}
	var buckets []int
	if err := db.Model(&outbox.BucketLease{}).Where("owner = ?", victimID).Pluck("bucket", &buckets).Error; err != nil {
		return row, err
	}
	owned := map[int]bool{}
	for _, b := range buckets {
		owned[b] = true
	}
	for b := 0; len(buckets) == 0 && b < bucketCount; b++ {
		owned[b] = true
	}
	if mode == ModeRestart {
		if _, err := relays.Start(victimID); err != nil {
			return row, err
		}
	} else if step.PeerAfterKill {
		if _, err := relays.Start(peerID); err != nil {
			return row, err
		}
	}
	if row.PoisonParked, _, err = repairPoison(ctx, db, head); err != nil {
		return row, err
	}
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var n int64
		if err := db.Model(&outbox.Message{}).Count(&n).Error; err != nil {
			return row, err
		}
		if n == 0 && consumer.Has(all) {
			break // else Verify reports what is missing
		}
	}
	time.Sleep(500 * time.Millisecond) // late copies
	if t, ok := consumer.FirstProducedAfter(killedAt, owned, bucketCount); ok {
		row.Resumed = t.Sub(killedAt)
	}
	ck := consumer.Verify(perKey, nil, nil, nil)
	row.Lost, row.Duplicates, row.OrderViolations = ck.Lost, ck.Duplicates, ck.OrderViolations
	if cfg.Transactional {
		row.RawOrderViolations, row.UnexplainedOrderViolations = consumer.txnOrderViolations(perKey)
	}
	return row, nil
}

// FormatMatrix renders rows as a Markdown table; the transactional
// variant's adds the order violations without deduplication, and those of
// them that no batch published again explains.
func FormatMatrix(rows []MatrixRow, transactional bool) string {
	var b strings.Builder
	if transactional {
		b.WriteString("| step (failpoints) | recovery | messages | lost | duplicates | order violations (dedup) | order violations (no dedup) | unexplained | delivery resumed after |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	} else {
		b.WriteString("| step (failpoints) | recovery | messages | lost | duplicates | order violations | delivery resumed after | poison parked |\n|---|---|---:|---:|---:|---:|---:|---|\n")
	}
	for _, r := range rows {
		resumed := "— (nothing left)"
		if r.Resumed >= 0 {
			resumed = r.Resumed.Round(10 * time.Millisecond).String()
		}
		fmt.Fprintf(&b, "| %s (`%s`) | %s | %d | %d | %d | %d | ", r.Step, r.Failpoints, r.Mode, r.Messages, r.Lost, r.Duplicates, r.OrderViolations)
		if transactional {
			fmt.Fprintf(&b, "%d | %d | %s |\n", r.RawOrderViolations, r.UnexplainedOrderViolations, resumed)
		} else {
			fmt.Fprintf(&b, "%s | %t |\n", resumed, r.PoisonParked)
		}
	}
	return b.String()
}
