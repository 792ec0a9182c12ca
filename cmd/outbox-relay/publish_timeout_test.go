package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/kafkapub"
)

// TestKafkaPublishTimeoutFlag: -kafka-publish-timeout (and its variable)
// sets kafkapub.Config.PublishTimeout, 10s by default; a negative value, a
// value not shorter than -max-publish-duration are configuration errors
// that say why, on one line, before anything connects.
func TestKafkaPublishTimeoutFlag(t *testing.T) {
	noEnv := func(string) string { return "" }
	cfg, err := parseConfig(base(t), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.kafka.PublishTimeout != kafkapub.DefaultPublishTimeout || kafkapub.DefaultPublishTimeout != 10*time.Second {
		t.Errorf("-kafka-publish-timeout default = %v; want 10s", cfg.kafka.PublishTimeout)
	}
	cfg, err = parseConfig(base(t), func(k string) string {
		if k == "OUTBOX_KAFKA_PUBLISH_TIMEOUT" {
			return "3s"
		}
		return ""
	})
	if err != nil || cfg.kafka.PublishTimeout != 3*time.Second {
		t.Errorf("OUTBOX_KAFKA_PUBLISH_TIMEOUT=3s: timeout %v, error %v; want 3s", cfg.kafka.PublishTimeout, err)
	}
	cfg, err = parseConfig(append(base(t), "-kafka-publish-timeout", "2s", "-max-publish-duration", "5s"), noEnv)
	if err != nil || cfg.kafka.PublishTimeout != 2*time.Second {
		t.Errorf("-kafka-publish-timeout 2s -max-publish-duration 5s: timeout %v, error %v; want 2s", cfg.kafka.PublishTimeout, err)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-kafka-publish-timeout", "-1s"}, `-kafka-publish-timeout "-1s": must not be negative`},
		{[]string{"-kafka-publish-timeout", "5"}, `-kafka-publish-timeout "5": a duration needs a unit`},
		{[]string{"-max-publish-duration", "10s"}, "-kafka-publish-timeout 10s must be shorter than -max-publish-duration 10s"},
		{[]string{"-kafka-publish-timeout", "20s", "-max-publish-duration", "15s"}, "-kafka-publish-timeout 20s must be shorter than -max-publish-duration 15s"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append(base(t), tc.args...), noEnv, &stdout, &stderr)
		msg := stderr.String()
		if code != exitConfig || !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want %d and one line containing %q", tc.args, code, msg, exitConfig, tc.want)
		}
	}
	if got := oneLine(errors.New("kafkapub: Config.PublishTimeout is negative (-1s)")); got != "kafkapub: -kafka-publish-timeout is negative (-1s)" {
		t.Errorf("publisher error on the command line = %q; want it to name -kafka-publish-timeout", got)
	}
}

// TestHealthzNamesTheFlags: /healthz's 503 reason names the worker's flags,
// not the relay's Go options, on one line.
func TestHealthzNamesTheFlags(t *testing.T) {
	h := healthz(func() error {
		return errors.New("relay: every publish has failed for 6m0s, longer than Options.PublishFailureWindow 5m0s (rows are kept and retried): broker down\nsecond line")
	})
	rec := httptest.NewRecorder()
	h(rec, httptest.NewRequest("GET", "/healthz", nil))
	body := rec.Body.String()
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(body, "longer than -publish-failure-window 5m0s") ||
		strings.Contains(body, "Options.") || strings.Count(body, "\n") != 1 {
		t.Errorf("/healthz = %d %q; want 503, one line naming -publish-failure-window", rec.Code, body)
	}
	rec = httptest.NewRecorder()
	healthz(func() error { return nil })(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != http.StatusOK || rec.Body.String() != "ok\n" {
		t.Errorf("/healthz healthy = %d %q; want 200 ok", rec.Code, rec.Body.String())
	}
}
