// Package franz runs package inbox's consumer loop (inbox.Consumer: retries,
// dead letters, outages never dead-lettered) on a franz-go group client
// reading with read_committed, so that records of aborted transactions and
// transaction markers never reach the handler. It is a module of its own so
// that franz-go stays out of the library's module graph; see
// docs/consuming.md.
package franz
