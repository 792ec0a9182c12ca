package pgnotify_test

// The tests that listen on PostgreSQL; those that need no database are in
// pgnotify/pgnotify_test.go.

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/gorm-outbox/outbox/pgnotify"
	"github.com/jackc/pgx/v5"
)

// listen runs tr.Listen in the background, sending received ids on a channel.
func listen(ctx context.Context, tr *pgnotify.Transport) (<-chan int, <-chan error) {
	got := make(chan int, 100)
	done := make(chan error, 1)
	go func() { done <- tr.Listen(ctx, func(b int) { got <- b }) }()
	return got, done
}

// waitListening waits until a LISTEN on channel is registered on the server.
func waitListening(t *testing.T, dsn, channel string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var pid int
		err := conn.QueryRow(context.Background(),
			"SELECT pid FROM pg_stat_activity WHERE query LIKE $1 AND pid <> pg_backend_pid() LIMIT 1", "LISTEN%"+channel+"%").Scan(&pid)
		if err == nil {
			return pid
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no LISTEN %s after 10s", channel)
	return 0
}

func receive(t *testing.T, got <-chan int, n int) []int {
	t.Helper()
	var out []int
	for len(out) < n {
		select {
		case b := <-got:
			out = append(out, b)
		case <-time.After(10 * time.Second):
			t.Fatalf("received %v; want %d ids", out, n)
		}
	}
	return out
}

func TestTransport(t *testing.T) {
	dsn, ok := testenv.PostgresDSN(t)
	if !ok {
		t.Skip("OUTBOX_TEST_POSTGRES_DSN not set")
	}
	baseline := runtime.NumGoroutine()
	newTransport := func(t *testing.T) *pgnotify.Transport {
		tr, err := pgnotify.New(pgnotify.Config{ConnString: dsn, Channel: testenv.Unique("ch_")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return tr
	}

	t.Run("published_ids_reach_listeners_duplicates_included", func(t *testing.T) {
		tr := newTransport(t)
		ctx, cancel := context.WithCancel(context.Background())
		got, done := listen(ctx, tr)
		waitListening(t, dsn, tr.Channel())
		for _, batch := range [][]int{{3, 5}, {3}, {-1}} {
			if err := tr.Publish(ctx, batch); err != nil {
				t.Fatalf("Publish(%v) = %v", batch, err)
			}
		}
		if ids := receive(t, got, 4); !slices.Equal(ids, []int{3, 5, 3, -1}) {
			t.Fatalf("received %v; want [3 5 3 -1]", ids)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Listen after cancel = %v; want context.Canceled", err)
		}
	})

	t.Run("killed_listening_connection_fails_Listen_and_a_new_Listen_recovers", func(t *testing.T) {
		tr := newTransport(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		_, done := listen(ctx, tr)
		pid := waitListening(t, dsn, tr.Channel())
		admin, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err == nil || errors.Is(err, context.Canceled) {
				t.Fatalf("Listen after pg_terminate_backend = %v; want the connection error", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Listen did not return after its connection was terminated")
		}
		got, done2 := listen(ctx, tr)
		waitListening(t, dsn, tr.Channel())
		if err := tr.Publish(ctx, []int{7}); err != nil {
			t.Fatal(err)
		}
		if ids := receive(t, got, 1); ids[0] != 7 {
			t.Fatalf("after reconnect received %v; want [7]", ids)
		}
		cancel()
		<-done2
	})

	t.Run("cancellation_waits_for_running_callbacks", func(t *testing.T) {
		tr := newTransport(t)
		ctx, cancel := context.WithCancel(context.Background())
		inCallback := make(chan struct{})
		release := make(chan struct{})
		var mu sync.Mutex
		finished := false
		done := make(chan error, 1)
		go func() {
			done <- tr.Listen(ctx, func(int) {
				close(inCallback)
				<-release
				mu.Lock()
				finished = true
				mu.Unlock()
			})
		}()
		waitListening(t, dsn, tr.Channel())
		if err := tr.Publish(ctx, []int{1}); err != nil {
			t.Fatal(err)
		}
		<-inCallback
		cancel()
		select {
		case err := <-done:
			t.Fatalf("Listen returned %v while its callback was still running", err)
		case <-time.After(50 * time.Millisecond):
		}
		close(release)
		<-done
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			t.Fatal("Listen returned before its callback finished")
		}
	})

	t.Run("no_goroutines_left_behind", func(t *testing.T) {
		// The subtests above cancelled their listeners; after Close, the
		// goroutine count returns to where it started.
		deadline := time.Now().Add(10 * time.Second)
		for runtime.NumGoroutine() > baseline+2 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > baseline+2 {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines running; want at most %d\n%s", n, baseline+2, buf[:runtime.Stack(buf, true)])
		}
	})
}
