package outbox

import (
	"regexp"
	"strings"
	"testing"
)

// TestTopicCharsMatchesTheRegexp checks the byte loop against the regexp it
// replaced, on every single byte and on assorted strings.
func TestTopicCharsMatchesTheRegexp(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
	cases := []string{"orders", "a.b_c-D9", "with space", "ünïcode", "tab\t", "semi;colon", "\xff", "a/b", strings.Repeat("x", 300)}
	for c := 0; c < 256; c++ {
		cases = append(cases, string([]byte{byte(c)}), "a"+string([]byte{byte(c)})+"z")
	}
	for _, s := range cases {
		if got, want := topicChars(s), re.MatchString(s); got != want {
			t.Errorf("topicChars(%q) = %v; the regexp says %v", s, got, want)
		}
	}
}
