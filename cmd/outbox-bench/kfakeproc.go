package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kfake"
)

// serveKfake runs an in-process kfake broker with the given partitions per
// topic, writes its address as one line to stdout, and serves until stdin
// reaches its end (the parent harness exited or closed it) or ctx ends. It
// is the child that -broker kfake-process starts: the same broker as
// -broker kfake, its CPU out of the harness process, its requests over a
// process boundary as a real broker's are.
func serveKfake(ctx context.Context, partitions int, stdin io.Reader, stdout io.Writer) error {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(partitions))
	if err != nil {
		return fmt.Errorf("outbox-bench: start kfake: %w", err)
	}
	defer c.Close()
	if _, err := fmt.Fprintln(stdout, strings.Join(c.ListenAddrs(), ",")); err != nil {
		return fmt.Errorf("outbox-bench: %w", err)
	}
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(eof)
	}()
	select {
	case <-eof:
	case <-ctx.Done():
	}
	return nil
}

// kfakeProcess is a kfake broker in a child process (this executable run
// with -serve-kfake).
type kfakeProcess struct {
	cmd   *exec.Cmd
	stdin io.Closer
	addrs []string
}

// startKfakeProcess starts the child and reads its address.
func startKfakeProcess(ctx context.Context, partitions int, stderr io.Writer) (*kfakeProcess, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("outbox-bench: kfake-process: %w", err)
	}
	cmd := exec.CommandContext(ctx, self, "-serve-kfake", "-partitions", strconv.Itoa(partitions))
	cmd.Stderr = stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("outbox-bench: kfake-process: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("outbox-bench: kfake-process: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("outbox-bench: kfake-process: %w", err)
	}
	p := &kfakeProcess{cmd: cmd, stdin: in}
	line, err := bufio.NewReader(out).ReadString('\n')
	if line = strings.TrimSpace(line); line == "" {
		p.stop()
		return nil, fmt.Errorf("outbox-bench: kfake-process: the child wrote no address: %w", errors.Join(err, io.ErrUnexpectedEOF))
	}
	p.addrs = strings.Split(line, ",")
	return p, nil
}

// stop closes the child's stdin, which ends it, and waits for it.
func (p *kfakeProcess) stop() {
	_ = p.stdin.Close()
	_ = p.cmd.Wait()
}
