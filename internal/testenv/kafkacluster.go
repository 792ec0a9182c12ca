package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Environment of the three-node Kafka cluster that `scripts/services.sh
// start-cluster` starts on request (CI starts none, so tests that need it
// are opt-in).
const (
	// EnvKafkaCluster lists the cluster's bootstrap addresses, e.g.
	// 127.0.0.1:29192,127.0.0.1:29193,127.0.0.1:29194.
	EnvKafkaCluster = "OUTBOX_TEST_KAFKA_CLUSTER_BROKERS"
	// EnvKafkaClusterDir is the cluster's state directory: node N's pid
	// file is node-N/pid (N is the broker's node.id).
	EnvKafkaClusterDir = "OUTBOX_TEST_KAFKA_CLUSTER_DIR"
)

// KafkaCluster is the multi-node Kafka cluster of scripts/services.sh
// start-cluster, with the means to kill, pause and restart its nodes.
type KafkaCluster struct {
	// Addrs are the bootstrap addresses, one per node.
	Addrs []string
	// Dir is the state directory (node-N/pid, node-N/kafka.log).
	Dir string
}

// Cluster returns the cluster named by OUTBOX_TEST_KAFKA_CLUSTER_BROKERS
// and OUTBOX_TEST_KAFKA_CLUSTER_DIR, or ok false when the brokers are not
// set. It is not part of OUTBOX_TEST_REQUIRE_ALL: the cluster is opt-in.
func Cluster(t testing.TB) (c KafkaCluster, ok bool) {
	t.Helper()
	v := os.Getenv(EnvKafkaCluster)
	if v == "" {
		return KafkaCluster{}, false
	}
	c = KafkaCluster{Addrs: strings.Split(v, ","), Dir: os.Getenv(EnvKafkaClusterDir)}
	if c.Dir == "" {
		c.Dir = "/tmp/gorm-outbox-cluster"
	}
	return c, true
}

// PID returns the pid of node's JVM, from its pid file; an error when the
// file is missing or the process does not exist.
func (c KafkaCluster) PID(node int) (int, error) {
	pid, err := ReadPID(filepath.Join(c.Dir, fmt.Sprintf("node-%d", node), "pid"))
	if err != nil {
		return 0, fmt.Errorf("testenv: node %d: %w", node, err)
	}
	return pid, nil
}

// Signal sends sig to node's JVM (SIGKILL, SIGSTOP, SIGCONT).
func (c KafkaCluster) Signal(node int, sig syscall.Signal) error {
	pid, err := c.PID(node)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("testenv: node %d: %v to %d: %w", node, sig, pid, err)
	}
	return nil
}

// Start starts node when it is not running (after a SIGKILL) with
// `scripts/services.sh start-cluster-node`, and returns once the node has
// started (registered with the controller quorum and unfenced).
func (c KafkaCluster) Start(ctx context.Context, node int) error {
	script, err := servicesScript()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "bash", script, "start-cluster-node", strconv.Itoa(node))
	cmd.Env = append(os.Environ(), "OUTBOX_CLUSTER_DIR="+c.Dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testenv: start-cluster-node %d: %w\n%s", node, err, out)
	}
	return nil
}

// servicesScript finds scripts/services.sh in the working directory or
// above it: the repository root, which holds the library's go.mod, above
// the nested modules (cmd/, examples/) that have their own.
func servicesScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		s := filepath.Join(dir, "scripts", "services.sh")
		if _, err := os.Stat(s); err == nil {
			return s, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testenv: no scripts/services.sh in the working directory or above it")
		}
		dir = parent
	}
}
