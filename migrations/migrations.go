// Package migrations holds the hand-written DDL of the outbox tables, one
// file per dialect (postgres.sql, mysql.sql, sqlite.sql), for teams that
// review and apply schema changes themselves. The files are identical to
// what outbox.AutoMigrate creates; a test on every database keeps them so.
package migrations

import (
	"embed"
	"fmt"
	"strings"
)

//go:embed *.sql
var files embed.FS

// SQL returns the DDL for dialect ("postgres", "mysql" or "sqlite", as gorm's
// Dialector.Name reports it).
func SQL(dialect string) (string, error) {
	b, err := files.ReadFile(dialect + ".sql")
	if err != nil {
		return "", fmt.Errorf("migrations: no DDL for dialect %q", dialect)
	}
	return string(b), nil
}

// Statements returns the DDL for dialect split into single statements,
// without comments, ready for one Exec each.
func Statements(dialect string) ([]string, error) {
	s, err := SQL(dialect)
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if i := strings.Index(l, "--"); i >= 0 {
			l = l[:i]
		}
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	var out []string
	for _, st := range strings.Split(strings.Join(lines, "\n"), ";") {
		if st = strings.TrimSpace(st); st != "" {
			out = append(out, st)
		}
	}
	return out, nil
}
