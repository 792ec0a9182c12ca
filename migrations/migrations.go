// Package migrations holds the hand-written DDL of the outbox tables, for
// teams that review and apply schema changes themselves (see
// docs/schema.md, which also covers upgrades).
//
// For each dialect (postgres, mysql, sqlite), <dialect>.sql is the full DDL
// of the current schema, identical to what outbox.AutoMigrate creates, and
// <dialect>/NNNNNN_name.up.sql and .down.sql are the same schema as
// versioned steps in the golang-migrate layout, which reads them straight
// from this package:
//
//	fsys, _ := migrations.Versioned("postgres")
//	src, _ := iofs.New(fsys, ".") // github.com/golang-migrate/migrate/v4/source/iofs
//	m, _ := migrate.NewWithSourceInstance("iofs", src, "postgres://…")
//	err := m.Up()
//
// (on MySQL and MariaDB add multiStatements=true to the DSN). A database
// created with <dialect>.sql or outbox.AutoMigrate is at the last version
// (3 on PostgreSQL, 2 elsewhere): mark it so (migrate force) before the
// first Up. For goose, register Steps' statements as Go migrations.
//
// inbox/<dialect>.sql is the DDL of package inbox's processed-messages
// table, identical to what inbox.AutoMigrate creates (InboxSQL,
// InboxStatements).
package migrations

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
)

//go:embed *.sql postgres mysql sqlite inbox
var files embed.FS

// SQL returns the full DDL of the current schema for dialect ("postgres",
// "mysql" or "sqlite", as gorm's Dialector.Name reports it).
func SQL(dialect string) (string, error) {
	b, err := files.ReadFile(dialect + ".sql")
	if err != nil {
		return "", fmt.Errorf("migrations: no DDL for dialect %q", dialect)
	}
	return string(b), nil
}

// Statements returns the full DDL for dialect split into single statements,
// without comments, ready for one Exec each.
func Statements(dialect string) ([]string, error) {
	s, err := SQL(dialect)
	if err != nil {
		return nil, err
	}
	return Split(s), nil
}

// InboxSQL returns the DDL of the inbox's processed-messages table (package
// inbox, default table name) for dialect ("postgres", "mysql" or "sqlite").
func InboxSQL(dialect string) (string, error) {
	b, err := files.ReadFile("inbox/" + dialect + ".sql")
	if err != nil {
		return "", fmt.Errorf("migrations: no inbox DDL for dialect %q", dialect)
	}
	return string(b), nil
}

// InboxStatements returns InboxSQL(dialect) split into single statements,
// without comments, ready for one Exec each.
func InboxStatements(dialect string) ([]string, error) {
	s, err := InboxSQL(dialect)
	if err != nil {
		return nil, err
	}
	return Split(s), nil
}

// Versioned returns the versioned steps of dialect as a file system in the
// golang-migrate layout (000001_init.up.sql, 000001_init.down.sql, …, at
// its root).
func Versioned(dialect string) (fs.FS, error) {
	if _, err := SQL(dialect); err != nil {
		return nil, err
	}
	sub, err := fs.Sub(files, dialect)
	if err != nil {
		return nil, fmt.Errorf("migrations: versioned steps of %q: %w", dialect, err)
	}
	return sub, nil
}

// Step is one version of the schema.
type Step struct {
	// Version is the step's number (1, 2, …) and Name its name ("init",
	// "parking").
	Version int
	Name    string
	// Up and Down are the step's statements (see Split), to apply in order.
	Up, Down []string
}

// Steps returns the versioned steps of dialect in version order, split into
// statements, for migration tools that take Go migrations.
func Steps(dialect string) ([]Step, error) {
	fsys, err := Versioned(dialect)
	if err != nil {
		return nil, err
	}
	ups, err := fs.Glob(fsys, "*.up.sql")
	if err != nil {
		return nil, err
	}
	slices.Sort(ups)
	out := make([]Step, 0, len(ups))
	for _, up := range ups {
		base := strings.TrimSuffix(path.Base(up), ".up.sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migrations: %s/%s: not NNNNNN_name.up.sql", dialect, up)
		}
		u, err := fs.ReadFile(fsys, up)
		if err != nil {
			return nil, err
		}
		d, err := fs.ReadFile(fsys, base+".down.sql")
		if err != nil {
			return nil, fmt.Errorf("migrations: %s/%s: no down step: %w", dialect, up, err)
		}
		out = append(out, Step{Version: v, Name: name, Up: Split(string(u)), Down: Split(string(d))})
	}
	return out, nil
}

// Split splits a file of this package into single statements without "--"
// comments, at semicolons outside dollar-quoted ($$) bodies.
func Split(s string) []string {
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
	var cur strings.Builder
	quoted := false
	text := strings.Join(lines, "\n")
	for i := 0; i < len(text); i++ {
		switch {
		case strings.HasPrefix(text[i:], "$$"):
			quoted = !quoted
			cur.WriteString("$$")
			i++
			continue
		case text[i] == ';' && !quoted:
			if st := strings.TrimSpace(cur.String()); st != "" {
				out = append(out, st)
			}
			cur.Reset()
			continue
		}
		cur.WriteByte(text[i])
	}
	if st := strings.TrimSpace(cur.String()); st != "" {
		out = append(out, st)
	}
	return out
}
