package bench

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
)

// EnqueueResult is one enqueue variant: a business transaction (one order
// row) with or without outbox rows.
type EnqueueResult struct {
	Variant string `json:"variant"`
	Tx      int    `json:"tx"`
	// Rows is the number of outbox rows per transaction.
	Rows int `json:"rows"`
	// TxMeanUs and TxP50Us are whole-transaction times (begin to commit).
	TxMeanUs float64 `json:"tx_mean_us"`
	TxP50Us  float64 `json:"tx_p50_us"`
	// StmtMeanUs is the mean time of the outbox statement alone, inside the
	// transaction (0 without one).
	StmtMeanUs float64 `json:"stmt_mean_us"`
	// PerMessageUs is the outbox statement time per outbox row.
	PerMessageUs float64 `json:"per_message_us"`
	// VsBusiness is TxMeanUs relative to the business transaction alone
	// (with the plugin registered).
	VsBusiness float64 `json:"vs_business"`
	// StmtVsHand is StmtMeanUs relative to the hand-written INSERT's.
	StmtVsHand float64 `json:"stmt_vs_hand"`
	// TxVsHand is TxMeanUs relative to the hand-written INSERT's.
	TxVsHand float64 `json:"tx_vs_hand"`
}

// benchOrder is the business row of the enqueue scenario.
type benchOrder struct {
	ID        int64  `gorm:"primaryKey"`
	Customer  string `gorm:"size:64"`
	Total     int64
	CreatedAt time.Time
}

func (benchOrder) TableName() string { return "bench_orders" }

const (
	varPlain    = "business tx, no plugin"
	varBusiness = "business tx (plugin registered)"
	varPlugin   = "+ 1 outbox row: tx.Create(&outbox.Message{…})"
	varHand     = "+ 1 outbox row: hand-written INSERT"
	varBatch    = "+ 100 outbox rows: outbox.Enqueue (one multi-row INSERT)"
)

func runEnqueue(ctx context.Context, e *env) ([]EnqueueResult, error) {
	e.cfg.Logger.Info("bench: enqueue", "tx_per_variant", e.cfg.EnqueueTx)
	plain, err := e.open(nil)
	if err != nil {
		return nil, err
	}
	defer closeDB(plain)
	withPlugin, err := e.open(&outbox.Plugin{Config: e.outboxConfig()})
	if err != nil {
		return nil, err
	}
	defer closeDB(withPlugin)
	if err := e.reset(plain); err != nil {
		return nil, err
	}
	if err := plain.AutoMigrate(&benchOrder{}); err != nil {
		return nil, fmt.Errorf("migrate orders: %w", err)
	}
	value := e.value()
	ocfg := e.outboxConfig().WithDefaults()
	hand := fmt.Sprintf("INSERT INTO %s (message_id, bucket, topic, record_key, record_value, headers, record_partition, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", outbox.DefaultMessagesTable)
	seq := 0
	order := func(tx *gorm.DB) error {
		seq++
		return tx.Create(&benchOrder{Customer: fmt.Sprintf("customer-%d", seq%1000), Total: int64(seq)}).Error
	}
	type variant struct {
		name string
		db   *gorm.DB
		rows int
		// outbox writes the outbox rows of one transaction.
		outbox func(tx *gorm.DB) error
	}
	variants := []variant{
		{varPlain, plain, 0, nil},
		{varBusiness, withPlugin, 0, nil},
		{varPlugin, withPlugin, 1, func(tx *gorm.DB) error {
			return tx.Create(&outbox.Message{Topic: "orders", Key: keyOf("order-", seq), Value: value}).Error
		}},
		{varHand, withPlugin, 1, func(tx *gorm.DB) error {
			id := outbox.NewUUID()
			key := keyOf("order-", seq)
			return tx.Exec(hand, id, outbox.BucketOf(key, nil, id, ocfg.BucketCount), "orders", key, value, nil, nil, time.Now().UTC()).Error
		}},
		{varBatch, withPlugin, 100, func(tx *gorm.DB) error {
			msgs := make([]*outbox.Message, 100)
			for i := range msgs {
				msgs[i] = outbox.NewMessage("orders", keyOf("order-", seq*100+i), value)
			}
			return outbox.Enqueue(tx, msgs...)
		}},
	}
	txTimes := make([][]time.Duration, len(variants))
	stmtTimes := make([]time.Duration, len(variants))
	const rounds = 4
	per := max(e.cfg.EnqueueTx/rounds, 1)
	// one runs a transaction of v and times it and its outbox statement.
	one := func(v variant) (total, stmt time.Duration, err error) {
		start := time.Now()
		err = v.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := order(tx); err != nil || v.outbox == nil {
				return err
			}
			s := time.Now()
			err := v.outbox(tx)
			stmt = time.Since(s)
			return err
		})
		if err != nil {
			err = fmt.Errorf("%s: %w", v.name, err)
		}
		return time.Since(start), stmt, err
	}
	for _, v := range variants { // a warm-up, not measured
		for range 10 {
			if _, _, err := one(v); err != nil {
				return nil, err
			}
		}
	}
	for range rounds {
		for i, v := range variants {
			for range per {
				total, stmt, err := one(v)
				if err != nil {
					return nil, err
				}
				txTimes[i] = append(txTimes[i], total)
				stmtTimes[i] += stmt
			}
		}
	}
	out := make([]EnqueueResult, len(variants))
	for i, v := range variants {
		n := len(txTimes[i])
		var sum time.Duration
		for _, d := range txTimes[i] {
			sum += d
		}
		r := EnqueueResult{Variant: v.name, Tx: n, Rows: v.rows,
			TxMeanUs: us(sum) / float64(n), TxP50Us: pct(txTimes[i], 50) * 1000}
		if v.rows > 0 {
			r.StmtMeanUs = us(stmtTimes[i]) / float64(n)
			r.PerMessageUs = r.StmtMeanUs / float64(v.rows)
		}
		out[i] = r
	}
	business, handRes := out[1], out[3]
	for i := range out {
		out[i].VsBusiness = ratio(out[i].TxMeanUs, business.TxMeanUs)
		if out[i].Rows == 1 {
			out[i].StmtVsHand = ratio(out[i].StmtMeanUs, handRes.StmtMeanUs)
			out[i].TxVsHand = ratio(out[i].TxMeanUs, handRes.TxMeanUs)
		}
	}
	return out, nil
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
