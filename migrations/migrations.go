// Package migrations holds the hand-written DDL of the outbox tables, for
// teams that review and apply schema changes themselves.
//
// Two forms are kept, for each dialect (postgres, mysql, sqlite):
//
//   - <dialect>.sql, the full DDL of the current schema (version 3 on
//     PostgreSQL, 2 elsewhere), identical to what outbox.AutoMigrate creates
//     on an empty database; a test on every database keeps them so. Use it for a new database.
//   - <dialect>/NNNNNN_name.up.sql and .down.sql, the versioned steps in the
//     golang-migrate layout: 000001_init (the initial schema) and
//     000002_parking (the parked_at_ms and parked_reason columns, the index
//     (bucket, parked_at_ms, id) replacing (bucket, id), and the relays
//     table's features column), and on PostgreSQL 000003_lease_fillfactor
//     (the leases table's fillfactor 40: a renewal updates every owned lease
//     in place). Applying every up step gives <dialect>.sql exactly;
//     outbox.AutoMigrate run over version 1 gives the same.
//
// golang-migrate reads the versioned steps straight from this package:
//
//	fsys, _ := migrations.Versioned("postgres")
//	src, _ := iofs.New(fsys, ".") // github.com/golang-migrate/migrate/v4/source/iofs
//	m, _ := migrate.NewWithSourceInstance("iofs", src, "postgres://…")
//	err := m.Up()
//
// (on MySQL and MariaDB add multiStatements=true to the DSN). A database
// created with <dialect>.sql or outbox.AutoMigrate is at the last version
// (3 on PostgreSQL, 2 elsewhere): mark it so (migrate force 3, or 2) before
// the first Up. goose needs its own annotations
// in one file per version: register Steps' statements as Go migrations
// (goose.AddNamedMigrationContext running each Up or Down statement) or copy
// the files into goose's format.
//
// # Upgrading to version 2 (parking)
//
// Apply 000002_parking.up.sql (or outbox.AutoMigrate) before deploying
// relays that park: it only adds nullable columns, a column with a default
// and an index, and relays of version 1 keep working on it. A relay parks
// only once every live relay writes the parking bit of its heartbeat, so a
// rolling upgrade is safe in any order after the migration. Downgrade only
// after requeueing or deleting every parked row, with the new relays stopped.
//
// # Upgrading to version 3 (PostgreSQL: lease fillfactor)
//
// Apply 000003_lease_fillfactor.up.sql (or outbox.AutoMigrate) at any time:
// it only sets a storage parameter (instant, nothing rewritten), and relays
// of every version work on both sides of it. It matters from a few thousand
// buckets: at 65,536 a renewal of every lease took ~0.5 s and ~14 MB of WAL
// without it, ~0.1 s and ~5 MB with it.
//
// # The inbox table
//
// inbox/<dialect>.sql is the DDL of the consumer side's processed-messages
// table (package inbox), identical to what inbox.AutoMigrate creates; a test
// on every database keeps them so. It is one table at its first version:
// apply it in the consumer's database (which may or may not be the
// outbox's) with InboxSQL or InboxStatements, or copy it into the
// consumer's own migrations.
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

// Split splits a file of these migrations into single statements, without
// comments: it cuts at semicolons outside dollar-quoted ($$) bodies and drops
// "--" comments. It is not a general SQL parser: it is meant for the files
// of this package.
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
