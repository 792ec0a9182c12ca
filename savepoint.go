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
// A bare name is folded to lower case; a quoted one ("…" or `…`) is kept
// exactly where quoting makes it case-sensitive (caseSensitiveQuoted).
func parseSavepoint(sql string, caseSensitiveQuoted bool) (op int, name string, ok bool) {
	s := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(sql), ";"))
	if len(s) > 512 || s == "" {
		return 0, "", false
	}
	// The name is the last token: a quoted identifier (a doubled quote
	// inside it stands for one) or a bare word.
	i := strings.LastIndexFunc(s, unicode.IsSpace) + 1
	if q := s[len(s)-1]; q == '"' || q == '`' {
		for i = len(s) - 2; i >= 0 && (s[i] != q || i > 0 && s[i-1] == q); i-- {
			if s[i] == q {
				i--
			}
		}
	}
	if i <= 0 || !unicode.IsSpace(rune(s[i-1])) {
		return 0, "", false
	}
	name, kw := s[i:], strings.Join(strings.Fields(s[:i]), " ")
	quoted := name[0] == '"' || name[0] == '`'
	if quoted {
		c := name[:1] // unquoted: the quote undoubled inside
		if name = strings.ReplaceAll(name[1:len(name)-1], c+c, c); name == "" {
			return 0, "", false
		}
	}
	if !quoted || !caseSensitiveQuoted {
		name = strings.ToLower(name)
	}
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
