// Package tests is the root of the library's test module
// (internal/tests/go.mod): tests of the library's packages, and of module
// inbox/franz, that need a module the tested module must not require (the
// test environment, franz-go, dbresolver), so that an importer's module
// graph holds only what the library compiles (scripts/importer-check.sh).
// Its directories mirror the packages they test, each an external test
// package; they run under `go test work` and in CI.
package tests
