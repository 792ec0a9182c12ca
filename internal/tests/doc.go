// Package tests is the root of the library's test module
// (github.com/gorm-outbox/outbox/internal/tests, internal/tests/go.mod): tests
// of the library's packages, and of module inbox/franz, that need a module
// the tested module itself must not require, so that an importer's module
// graph holds only what the library (or inbox/franz) compiles
// (scripts/importer-check.sh). Its directories mirror the packages they
// test: internal/tests/outbox holds tests of the root package,
// internal/tests/gormstore tests of gormstore, internal/tests/inbox/franz
// tests of inbox/franz, each an external test package (outbox_test,
// gormstore_test, franz_test) named as in the package it tests. They run
// with the rest under `go test work` and in CI.
//
// It holds every test that needs the test environment (module
// internal/testenv: databases, the in-process broker kfake, the MySQL
// driver), franz-go or GORM's read/write splitting plugin
// (gorm.io/plugin/dbresolver).
package tests
