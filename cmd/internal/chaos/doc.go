// Package chaos is the reliability harness of gorm-outbox: a crash matrix
// that SIGKILLs a real relay child process at each step of its life (with
// the failpoints compiled into binaries built with -tags outbox_failpoints),
// a chaos run that drives writers and several relay processes against a
// database and a Kafka broker while injecting faults, then checks with an
// independent consumer that nothing was lost, nothing rolled back arrived,
// per-key order held and no bucket ever had two live owners (its membership
// variant changes the fleet on a fixed schedule instead, and measures how
// long buckets went without a live owner and records took to arrive), and
// an effects run (RunEffects) that audits the consumers' databases instead:
// inbox consumer processes of both Kafka clients apply one effect per
// message under relay, consumer, broker and database faults, each proven
// from the processes' logs.
//
// The relay child is the "relay" subcommand of cmd/outbox-chaos (RunRelay),
// the consumer child its "consumer" subcommand (RunConsumer); the harness
// starts them with Relays and consumer groups. See CHAOS.md for the
// commands and the figures.
package chaos
