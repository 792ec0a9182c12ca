package bench

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteTables prints the report as aligned text tables, one per scenario.
func (r *Report) WriteTables(w io.Writer) error {
	fmt.Fprintf(w, "outbox-bench: db=%s (%s) broker=%s N=%d value=%dB buckets=%d partitions=%d batch=%d cpus=%d %s\n",
		r.Config.DB, r.DBVersion, r.Config.Broker, r.Config.N, r.Config.ValueSize, r.Config.Buckets, r.Config.Partitions,
		r.Config.BatchSize, r.Machine.NumCPU, r.Machine.GoVersion)
	if r.Config.MaxIdleConns > 0 {
		fmt.Fprintf(w, "pools: MaxIdleConns=%d\n", r.Config.MaxIdleConns)
	}
	if r.Config.MaxConcurrentBuckets > 0 {
		fmt.Fprintf(w, "relays: MaxConcurrentBuckets=%d\n", r.Config.MaxConcurrentBuckets)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if len(r.Drain) > 0 {
		fmt.Fprintln(w, "\nDrain throughput (preload committed in one transaction; until the table is empty and every id consumed)")
		fmt.Fprintln(tw, "name\trelays\trows\tseconds\tmsg/s\tvs raw\tvs naive\tcpu/s\tcpu µs/msg\tcpu vs raw\tdb µs/msg\t+db vs raw\tq1 msg/s\tq4 msg/s\tq4/q1\tlease losses\tpreload s\tanalyze s\t")
		for _, d := range r.Drain {
			losses := "-"
			if d.LeaseLosses != nil {
				losses = strconv.FormatInt(*d.LeaseLosses, 10)
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%.0f\t%s\t%s\t%.2f\t%.1f\t%s\t%s\t%s\t%.0f\t%.0f\t%s\t%s\t%.1f\t%s\t\n", d.Name, d.Relays, d.Rows, d.Seconds, d.MsgPerSec,
				x(d.VsRaw), x(d.VsNaive), d.CPUPerSec, d.CPUPerMsgUs, x(d.CPUVsRaw), num(d.DBCPUPerMsgUs), x(d.AllCPUVsRaw), d.FirstQuarterMsgPerSec, d.LastQuarterMsgPerSec,
				x(d.EndVsStart), losses, d.PreloadSeconds, secs(d.AnalyzeSeconds))
		}
		tw.Flush()
		fmt.Fprintln(w, "  cpu: this process (relays or loop, consumer, and kfake when in-process); db: the PostgreSQL backends of the run's database")
		fmt.Fprintln(w, "  (from /proc, a lower bound; -: not measured); +db vs raw: both per message vs the raw loop's; q1/q4: consumer's rate over the first/last quarter of the ids;")
		fmt.Fprintln(w, "  lease losses: sum of outbox.lease.expirations over the fleet from its start until drained (no fault injected)")
		fmt.Fprintln(w, "  each contender's preload and drain start after a checkpoint (PostgreSQL CHECKPOINT, SQLite wal_checkpoint): one write-ahead log cycle each")
		for _, d := range r.Drain {
			if d.Note != "" {
				fmt.Fprintf(w, "  %s: %s\n", d.Name, d.Note)
			}
		}
	}
	if len(r.Latency) > 0 {
		fmt.Fprintln(w, "\nLatency at a steady commit rate (ms from the writer's commit returning; 1 relay)")
		fmt.Fprintln(tw, "mode\trate/s\tachieved\tmsgs\tack p50\tack p95\tack p99\tack max\tconsume p50\tconsume p95\tconsume p99\tcommit p50\tcommit p99\t")
		for _, l := range r.Latency {
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", l.Mode, l.Rate, l.Achieved, l.Messages,
				l.AckP50, l.AckP95, l.AckP99, l.AckMax, l.ConsumeP50, l.ConsumeP95, l.ConsumeP99, l.CommitP50, l.CommitP99)
		}
		tw.Flush()
		var notes []string
		for _, l := range r.Latency {
			if l.Note != "" && !slices.Contains(notes, l.Mode+": "+l.Note) {
				notes = append(notes, l.Mode+": "+l.Note)
			}
		}
		for _, n := range notes {
			fmt.Fprintf(w, "  %s\n", n)
		}
	}
	if len(r.Enqueue) > 0 {
		fmt.Fprintln(w, "\nEnqueue overhead (µs; one order row per transaction, plus outbox rows)")
		fmt.Fprintln(tw, "variant\ttx\ttx mean\ttx p50\tvs business\toutbox stmt\tper message\tstmt vs hand\ttx vs hand\t")
		for _, q := range r.Enqueue {
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n", q.Variant, q.Tx, q.TxMeanUs, q.TxP50Us, x(q.VsBusiness),
				num(q.StmtMeanUs), num(q.PerMessageUs), x(q.StmtVsHand), x(q.TxVsHand))
		}
		tw.Flush()
	}
	if len(r.Idle) > 0 {
		fmt.Fprintln(w, "\nIdle cost (statements on an empty table, default options: poll 1s, lease renew 10s)")
		fmt.Fprintln(tw, "relays\twindow s\tstatements\tfleet stmt/s\tpending q/s/relay\tupkeep stmt/s/relay\tby kind\t")
		for _, i := range r.Idle {
			var kinds []string
			for k, v := range i.ByKind {
				kinds = append(kinds, fmt.Sprintf("%s=%d", k, v))
			}
			slices.Sort(kinds)
			fmt.Fprintf(tw, "%d\t%.0f\t%d\t%.2f\t%.2f\t%.2f\t%s\t\n", i.Relays, i.WindowSeconds, i.Statements, i.PerSec,
				i.PendingPerRelaySec, i.UpkeepPerRelaySec, strings.Join(kinds, " "))
		}
		tw.Flush()
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	_, err := fmt.Fprintf(w, "total %.0fs\n", r.Seconds)
	return err
}

// x, secs and num format a ratio, seconds and a figure; 0 (not measured) is "-".
func x(v float64) string    { return dash("%.2f×", v) }
func secs(v float64) string { return dash("%.2f", v) }
func num(v float64) string  { return dash("%.1f", v) }

func dash(format string, v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf(format, v)
}
