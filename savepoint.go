package outbox

import (
	"slices"
	"strings"
	"unicode"
)

// Savepoint statements, as trackSavepoints follows them.
const (
	opSavepoint = iota + 1
	opRollbackTo
	opRelease
)

// parseSavepoint recognises the savepoint statements the three databases
// accept, whatever their case and spacing, with an optional trailing
// semicolon:
//
//	SAVEPOINT name
//	ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name
//	RELEASE [SAVEPOINT] name
//
// name is a bare identifier, folded to lower case (all three compare them
// case-insensitively), or quoted with "…" or `…`: kept exactly on
// PostgreSQL (caseSensitiveQuoted), where quoting makes a name
// case-sensitive, and folded elsewhere.
func parseSavepoint(sql string, caseSensitiveQuoted bool) (op int, name string, ok bool) {
	words, name, ok := splitSavepoint(sql)
	if !ok {
		return 0, "", false
	}
	quoted := name[0] == '"' || name[0] == '`'
	if quoted {
		name = unquote(name)
		if name == "" {
			return 0, "", false
		}
	}
	if !quoted || !caseSensitiveQuoted {
		name = strings.ToLower(name)
	}
	kw := strings.Join(words, " ")
	is := func(forms ...string) bool {
		return slices.ContainsFunc(forms, func(f string) bool { return strings.EqualFold(kw, f) })
	}
	switch {
	case is("SAVEPOINT"):
		return opSavepoint, name, true
	case is("ROLLBACK TO", "ROLLBACK TO SAVEPOINT", "ROLLBACK WORK TO", "ROLLBACK WORK TO SAVEPOINT",
		"ROLLBACK TRANSACTION TO", "ROLLBACK TRANSACTION TO SAVEPOINT"):
		return opRollbackTo, name, true
	case is("RELEASE", "RELEASE SAVEPOINT"):
		return opRelease, name, true
	}
	return 0, "", false
}

// splitSavepoint splits a statement into its leading keywords and its last
// token (the savepoint name, quoted or not).
func splitSavepoint(sql string) (words []string, name string, ok bool) {
	s := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(sql), ";"))
	if len(s) > 512 || s == "" {
		return nil, "", false
	}
	switch q := s[len(s)-1]; q {
	case '"', '`':
		i := len(s) - 2
		for ; i >= 0; i-- {
			if s[i] == q {
				if i > 0 && s[i-1] == q { // a doubled quote inside the name
					i--
					continue
				}
				break
			}
		}
		if i < 0 {
			return nil, "", false
		}
		name, s = s[i:], s[:i]
	default:
		i := strings.LastIndexFunc(s, unicode.IsSpace)
		if i < 0 {
			return nil, "", false
		}
		name, s = s[i+1:], s[:i+1]
	}
	if s != "" && !unicode.IsSpace(rune(s[len(s)-1])) {
		return nil, "", false
	}
	words = strings.Fields(s)
	if len(words) == 0 || len(words) > 4 {
		return nil, "", false
	}
	return words, name, true
}

// unquote removes the quotes around a quoted identifier and undoubles the
// quote character inside it.
func unquote(q string) string {
	if len(q) < 2 {
		return ""
	}
	c := q[:1]
	return strings.ReplaceAll(q[1:len(q)-1], c+c, c)
}
