package relay

import "errors"

// ErrMisconfigured is wrapped by errors that no retry can fix: writers and
// relays disagreeing on BucketCount (rows in a bucket the relays never
// claim), or a publish that exceeded Options.MaxPublishDuration. Store
// implementations return it from AcquireBucketLeases; Run returns it and
// stops, so that a misconfigured deployment fails loudly instead of
// silently never publishing.
var ErrMisconfigured = errors.New("misconfigured")
