// Package chaos is the reliability harness of gorm-outbox (CHAOS.md): a
// crash matrix that SIGKILLs a relay child process at each step of its life
// (failpoints, -tags outbox_failpoints), chaos runs that drive writers and
// relay processes while injecting faults (or, their membership variant,
// changing the fleet) and check with an independent consumer that nothing
// was lost, rolled back, reordered or owned twice, a failover run against a
// Kafka cluster, and an effects run that audits the databases of inbox
// consumer processes. The children are cmd/outbox-chaos's "relay" and
// "consumer" subcommands (RunRelay, RunConsumer).
package chaos
