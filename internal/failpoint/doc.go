// Package failpoint marks the steps of a relay's and a consumer's life where
// a crash test can stop the process: the engine (relay), the Kafka publisher
// (kafkapub) and the inbox consumer (inbox) call Inject at each. In a normal
// build Inject is empty and inlined, so it costs nothing; a binary built with
// -tags outbox_failpoints arms the failpoints named in the OUTBOX_FAILPOINTS
// environment variable (see failpoint_on.go, which lists them).
package failpoint
