// Package failpoint marks the steps of a relay's life where a crash test can
// stop the process: the engine (relay) and the Kafka publisher (kafkapub)
// call Inject at each. In a normal build Inject is empty and inlined, so it
// costs nothing; a binary built with -tags outbox_failpoints arms the
// failpoints named in the OUTBOX_FAILPOINTS environment variable (see
// failpoint_on.go, which lists them).
package failpoint
