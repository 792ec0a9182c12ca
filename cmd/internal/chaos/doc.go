// Package chaos is the reliability harness of gorm-outbox: a crash matrix
// that SIGKILLs a real relay child process at each step of its life (with
// the failpoints compiled into binaries built with -tags outbox_failpoints),
// and a chaos run that drives writers and several relay processes against a
// database and a Kafka broker while injecting faults, then checks with an
// independent consumer that nothing was lost, nothing rolled back arrived,
// per-key order held and no bucket ever had two live owners.
//
// The relay child is the "relay" subcommand of cmd/outbox-chaos (RunRelay);
// the harness starts it with Relays. See CHAOS.md for the commands and the
// figures.
package chaos
