package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// promqlKeywords are PromQL words that are never metric names: binary
// operators, modifiers and the values of numbers.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true,
	"inf": true, "nan": true, "start": true, "end": true,
}

// promqlLabelLists are the words followed by a parenthesised list of label
// names.
var promqlLabelLists = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// promqlAggregations are the aggregation operators, which may come before
// their clause (sum by (x) (…)) rather than before "(".
var promqlAggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

// promqlMetrics returns the metric names a PromQL expression (or a
// Grafana label_values query) selects, sorted and distinct: every
// identifier that is not a function, aggregation, keyword, label name (in
// a {…} matcher or a by/without/on/ignoring/group_* list, or label_values'
// second argument) or Grafana variable ($x, ${x}, [[x]]), plus the value
// of a {__name__="…"} matcher. Strings, numbers, durations, comments and
// ranges ([5m], [$__rate_interval]) are skipped. It is a tokenizer, not a
// parser: it does not check the expression's grammar, only that brackets
// and strings are closed.
func promqlMetrics(expr string) ([]string, error) {
	names := map[string]bool{}
	if err := promqlScan(expr, names); err != nil {
		return nil, fmt.Errorf("%q: %w", expr, err)
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

func isIdentStart(r rune) bool { return r == '_' || r == ':' || unicode.IsLetter(r) }
func isIdent(r rune) bool      { return isIdentStart(r) || unicode.IsDigit(r) }

func promqlScan(expr string, names map[string]bool) error {
	s := []rune(expr)
	i := 0
	skipSpace := func(j int) int {
		for j < len(s) && unicode.IsSpace(s[j]) {
			j++
		}
		return j
	}
	// skipString returns the index after the string starting at j.
	skipString := func(j int) (int, error) {
		q := s[j]
		for j++; j < len(s); j++ {
			switch {
			case s[j] == '\\' && q != '`':
				j++
			case s[j] == q:
				return j + 1, nil
			}
		}
		return 0, fmt.Errorf("unterminated string")
	}
	// closing returns the index after the bracket that closes the one at j,
	// skipping strings.
	closing := func(j int) (int, error) {
		open := s[j]
		close := map[rune]rune{'(': ')', '[': ']', '{': '}'}[open]
		depth := 0
		for ; j < len(s); j++ {
			switch s[j] {
			case '"', '\'', '`':
				k, err := skipString(j)
				if err != nil {
					return 0, err
				}
				j = k - 1
			case open:
				depth++
			case close:
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, fmt.Errorf("unclosed %q", open)
	}
	for i < len(s) {
		r := s[i]
		switch {
		case unicode.IsSpace(r):
			i++
		case r == '#': // a comment, to the end of the line
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case r == '"' || r == '\'' || r == '`':
			j, err := skipString(i)
			if err != nil {
				return err
			}
			i = j
		case r == '$': // a Grafana variable: $name or ${name…}
			i++
			if i < len(s) && s[i] == '{' {
				j, err := closing(i)
				if err != nil {
					return err
				}
				i = j
				continue
			}
			for i < len(s) && isIdent(s[i]) {
				i++
			}
		case r == '[': // a range, a subquery's range, or Grafana's [[name]]
			j, err := closing(i)
			if err != nil {
				return err
			}
			i = j
		case r == '{': // label matchers: only __name__ names a metric
			j, err := closing(i)
			if err != nil {
				return err
			}
			if err := promqlMatchers(string(s[i+1:j-1]), names); err != nil {
				return err
			}
			i = j
		case unicode.IsDigit(r) || r == '.' && i+1 < len(s) && unicode.IsDigit(s[i+1]):
			// A number or a duration: 300, 0.99, 1e-3, 0x1f, 5m, 1h30m.
			hex := strings.HasPrefix(strings.ToLower(string(s[i:min(i+2, len(s))])), "0x")
			for i < len(s) && (isIdent(s[i]) || s[i] == '.' ||
				(s[i] == '-' || s[i] == '+') && !hex && (s[i-1] == 'e' || s[i-1] == 'E')) {
				i++
			}
		case isIdentStart(r):
			j := i
			for j < len(s) && isIdent(s[j]) {
				j++
			}
			word := string(s[i:j])
			next := skipSpace(j)
			switch {
			case promqlLabelLists[strings.ToLower(word)]:
				// by (a, b): label names, not metrics.
				if next < len(s) && s[next] == '(' {
					k, err := closing(next)
					if err != nil {
						return err
					}
					j = k
				}
			case word == "label_values" && next < len(s) && s[next] == '(':
				// Grafana: label_values(selector, label) or label_values(label).
				k, err := closing(next)
				if err != nil {
					return err
				}
				args := splitTopLevel(string(s[next+1 : k-1]))
				if len(args) == 2 {
					if err := promqlScan(args[0], names); err != nil {
						return err
					}
				}
				j = k
			case promqlKeywords[strings.ToLower(word)], promqlAggregations[strings.ToLower(word)]:
			case next < len(s) && s[next] == '(': // a function call
			default:
				names[word] = true
			}
			i = j
		default: // operators, commas, parentheses
			i++
		}
	}
	return nil
}

// promqlMatchers adds the metric name of a {__name__="x"} matcher list.
func promqlMatchers(list string, names map[string]bool) error {
	for _, m := range splitTopLevel(list) {
		name, value, ok := strings.Cut(m, "=")
		if !ok || strings.TrimSpace(name) != "__name__" || strings.HasPrefix(value, "~") || strings.HasPrefix(value, "=") {
			continue
		}
		value = strings.TrimSpace(value)
		if len(value) >= 2 && strings.ContainsRune("\"'`", rune(value[0])) && value[len(value)-1] == value[0] {
			names[value[1:len(value)-1]] = true
		}
	}
	return nil
}

// splitTopLevel splits s at the commas outside brackets and strings.
func splitTopLevel(s string) []string {
	var parts []string
	depth, start := 0, 0
	var quote rune
	for i, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '"' || r == '\'' || r == '`':
			quote = r
		case r == '(' || r == '[' || r == '{':
			depth++
		case r == ')' || r == ']' || r == '}':
			depth--
		case r == ',' && depth == 0:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	if strings.TrimSpace(s[start:]) != "" || len(parts) > 0 {
		parts = append(parts, s[start:])
	}
	return parts
}

func TestPromQLMetricNames(t *testing.T) {
	cases := []struct {
		expr string
		want []string
	}{
		{`max by (outbox_name) (outbox_pending_oldest_age_seconds) > 300`, []string{"outbox_pending_oldest_age_seconds"}},
		{`sum by (outbox_name) (rate(outbox_publish_failures_total[5m])) > 0`, []string{"outbox_publish_failures_total"}},
		{`histogram_quantile(0.99, sum by (le, outbox_name) (rate(outbox_publish_duration_seconds_bucket{outbox_name=~"$outbox"}[$__rate_interval])))`,
			[]string{"outbox_publish_duration_seconds_bucket"}},
		{`sum without (instance) (rate(a_total[5m] offset 1h30m)) / on (job) group_left (x, y) b{job="z"}`, []string{"a_total", "b"}},
		{`sum(a) by (le) + ignoring(instance) avg(c)`, []string{"a", "c"}},
		{`{__name__="named_by_matcher", job="x"} or {__name__=~"regex_.*"}`, []string{"named_by_matcher"}},
		{`label_values(outbox_owned_buckets, outbox_name)`, []string{"outbox_owned_buckets"}},
		{`label_values(outbox_name)`, nil},
		{`rate(x_total[5m:1m] @ 1609746000) and bool y unless z`, []string{"x_total", "y", "z"}},
		{`max by (outbox_name) (abs(outbox_clock_offset_seconds)) > 1e-3 * 10E+2 * 0x1e-m - .5 + Inf - NaN`, []string{"m", "outbox_clock_offset_seconds"}},
		{"a # a comment with not_a_metric\n + b", []string{"a", "b"}},
		{`label_replace(up_metric, "dst", "$1", "src", "(.*)") > ${threshold} * [[factor]]`, []string{"up_metric"}},
		{`increase(outbox_parked_total{outbox_park_reason!="held", x="}{"}[15m])`, []string{"outbox_parked_total"}},
		{`topk(5, count_values("value", build_info))`, []string{"build_info"}},
		{`metric:recorded:rate5m > 0`, []string{"metric:recorded:rate5m"}},
	}
	for _, tc := range cases {
		got, err := promqlMetrics(tc.expr)
		if err != nil {
			t.Errorf("promqlMetrics(%q): %v", tc.expr, err)
			continue
		}
		if !slices.Equal(got, tc.want) && (len(got) != 0 || len(tc.want) != 0) {
			t.Errorf("promqlMetrics(%q) = %q; want %q", tc.expr, got, tc.want)
		}
	}
	for _, bad := range []string{`rate(x[5m)`, `x{a="b}`, `sum by (a (x)`} {
		if got, err := promqlMetrics(bad); err == nil {
			t.Errorf("promqlMetrics(%q) = %q, nil; want an error", bad, got)
		}
	}
}
