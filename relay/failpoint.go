package relay

import fp "github.com/gorm-outbox/outbox/internal/failpoint"

// failpoint marks a step of the relay's life where a crash test can stop the
// process (see internal/failpoint; built with -tags outbox_failpoints). In a
// normal build it is empty and inlined: it costs nothing.
func failpoint(name string) { fp.Inject(name) }
