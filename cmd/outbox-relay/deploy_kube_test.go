package main

// Tests of deploy/Dockerfile and deploy/kubernetes/ against the worker
// itself: the image is built by the same `go build` these tests run and
// runs as a non-root user; the manifests set only flags and variables the
// worker has, into a configuration it accepts; the grace period outlasts
// the worker's stop; and every probe and scrape path answers on a running
// worker built by the Dockerfile's command.

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gorm-outbox/outbox/internal/testenv"
)

var kubeDir = filepath.Join(deployDir, "kubernetes")

// dockerInstr is one instruction of a Dockerfile, its continuation lines
// joined.
type dockerInstr struct {
	cmd  string // upper case: FROM, RUN, ...
	args string
}

// dockerStage is one FROM and the instructions after it.
type dockerStage struct {
	from, name string
	instrs     []dockerInstr
}

// readDockerfile parses deploy/Dockerfile into its stages.
func readDockerfile(t *testing.T) []dockerStage {
	t.Helper()
	f, err := os.Open(filepath.Join(deployDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stages []dockerStage
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := dockerInstr{strings.ToUpper(cmd), strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			for len(f) > 1 && strings.HasPrefix(f[0], "--") { // --platform=...
				f = f[1:]
			}
			st := dockerStage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
			return
		}
		if len(stages) == 0 && in.cmd != "ARG" {
			t.Fatalf("Dockerfile: %s before any FROM", in.cmd)
		}
		if len(stages) > 0 {
			stages[len(stages)-1].instrs = append(stages[len(stages)-1].instrs, in)
		}
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue // a comment, also between continuation lines
		}
		if body, ok := strings.CutSuffix(strings.TrimRight(line, " \t"), `\`); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	flush()
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return stages
}

// dockerBuild is the build stage's go build: the stage, its environment
// (ENV lines) and the command's words.
type dockerBuild struct {
	stage  dockerStage
	index  int // of the stage
	env    []string
	argv   []string // go build ... ./cmd/outbox-relay
	output string   // the -o path
}

// readDockerBuild finds the one RUN of the Dockerfile that runs go build,
// and checks that it builds ./cmd/outbox-relay from the repository root
// with cgo.
func readDockerBuild(t *testing.T, stages []dockerStage) dockerBuild {
	t.Helper()
	var found []dockerBuild
	for i, st := range stages {
		var env []string
		for _, in := range st.instrs {
			switch in.cmd {
			case "ENV":
				for _, kv := range strings.Fields(in.args) {
					if !strings.Contains(kv, "=") {
						t.Fatalf("Dockerfile: ENV %s: want NAME=value", in.args)
					}
					env = append(env, kv)
				}
			case "RUN":
				if !strings.Contains(in.args, "go build") {
					continue
				}
				words := strings.Fields(in.args)
				for len(words) > 0 && strings.HasPrefix(words[0], "--") { // --mount=type=cache,...
					words = words[1:]
				}
				for len(words) > 0 && strings.Contains(words[0], "=") { // NAME=value go build
					env = append(env, words[0])
					words = words[1:]
				}
				if strings.ContainsAny(in.args, `"'$;&|`) {
					t.Fatalf("Dockerfile: RUN %s: want a plain go build command (no quoting, variables or shell operators) that this test can run as written", in.args)
				}
				found = append(found, dockerBuild{stage: st, index: i, env: slices.Clone(env), argv: words})
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("Dockerfile: %d RUN lines with go build; want one", len(found))
	}
	b := found[0]
	if len(b.argv) < 3 || b.argv[0] != "go" || b.argv[1] != "build" || b.argv[len(b.argv)-1] != "./cmd/outbox-relay" {
		t.Fatalf("Dockerfile: build command %q; want go build [flags] ./cmd/outbox-relay", b.argv)
	}
	for i, w := range b.argv[:len(b.argv)-1] {
		if w == "-o" {
			b.output = b.argv[i+1]
		}
	}
	if !filepath.IsAbs(b.output) {
		t.Errorf("Dockerfile: go build -o %q; want an absolute path for the final stage to copy", b.output)
	}
	if !slices.Contains(b.env, "CGO_ENABLED=1") {
		t.Errorf("Dockerfile: the build stage's environment %q lacks CGO_ENABLED=1: the worker links the cgo SQLite driver", b.env)
	}
	// The command runs at the repository root (go.work resolves the
	// library's placeholder version there): the whole context is copied to
	// the working directory.
	var workdir string
	copied := false
	for _, in := range b.stage.instrs {
		switch {
		case in.cmd == "WORKDIR":
			workdir = in.args
		case in.cmd == "COPY" && in.args == ". .":
			copied = workdir != ""
		}
	}
	if !copied {
		t.Errorf("Dockerfile: the build stage does not COPY . . into its WORKDIR: go build must run at the repository root, in the go.work workspace")
	}
	return b
}

// TestDockerfileBuildsTheWorkerWithCgoAndRunsItAsNonRoot: the Dockerfile's
// build stage runs one `go build` of ./cmd/outbox-relay with cgo from the
// repository root (the command TestDeployProbesAnswerOnTheWorkerTheDockerfileBuilds
// runs), and its final stage is a glibc image that copies that binary,
// runs it as a numeric non-root user in exec form and sets only variables
// the worker reads.
func TestDockerfileBuildsTheWorkerWithCgoAndRunsItAsNonRoot(t *testing.T) {
	stages := readDockerfile(t)
	if len(stages) < 2 {
		t.Fatalf("Dockerfile: %d stages; want a build stage and a final one", len(stages))
	}
	build := readDockerBuild(t, stages)
	final := stages[len(stages)-1]
	if build.index == len(stages)-1 || build.stage.name == "" {
		t.Fatal("Dockerfile: the go build runs in the final stage, or in an unnamed one; want a named build stage and a small final image without the toolchain")
	}
	// cgo links glibc dynamically: no scratch, no musl.
	if base := strings.ToLower(final.from); base == "scratch" || strings.Contains(base, "alpine") || strings.Contains(base, "static") {
		t.Errorf("Dockerfile: final stage FROM %s; the cgo binary needs glibc", final.from)
	}
	var user, entrypoint, copiedTo string
	flags := newFlagSet(&config{})
	for _, in := range final.instrs {
		switch in.cmd {
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entrypoint = in.args
		case "COPY":
			f := strings.Fields(in.args)
			if len(f) == 3 && f[0] == "--from="+build.stage.name && f[1] == build.output {
				copiedTo = f[2]
			}
		case "ENV":
			for _, kv := range strings.Fields(in.args) {
				name, _, _ := strings.Cut(kv, "=")
				if err := workerReads(flags, name); err != nil {
					t.Errorf("Dockerfile: ENV %s: %v", name, err)
				}
			}
		case "RUN":
			t.Errorf("Dockerfile: the final stage runs %q; want only the copied binary", in.args)
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("Dockerfile: final stage USER %q; want a numeric non-root user, which runAsNonRoot can verify", user)
	}
	if copiedTo == "" {
		t.Fatalf("Dockerfile: the final stage does not COPY --from=%s %s", build.stage.name, build.output)
	}
	var argv []string
	if err := json.Unmarshal([]byte(entrypoint), &argv); err != nil || len(argv) == 0 || argv[0] != copiedTo {
		t.Errorf("Dockerfile: ENTRYPOINT %s; want the exec form [%q], so that the worker is PID 1 and receives SIGTERM", entrypoint, copiedTo)
	}
}

// workerReads says whether the worker reads the environment variable name:
// an OUTBOX_* variable of one of its flags, or one of the Go runtime's.
func workerReads(flags *flag.FlagSet, name string) error {
	if !strings.HasPrefix(name, envPrefix) {
		switch name {
		case "GOMAXPROCS", "GOMEMLIMIT", "GOGC", "GODEBUG", "GOTRACEBACK":
			return nil
		}
		return fmt.Errorf("not a variable the worker reads (OUTBOX_* or the Go runtime's)")
	}
	found := false
	flags.VisitAll(func(f *flag.Flag) { found = found || envName(f.Name) == name })
	if !found {
		return fmt.Errorf("no flag of the worker has this variable (outbox-relay help flags)")
	}
	return nil
}

// kubeSelector is a label selector of matchLabels only.
type kubeSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

// kubeProbe is a probe; only httpGet probes are checked against the worker.
type kubeProbe struct {
	HTTPGet *struct {
		Path string    `yaml:"path"`
		Port yaml.Node `yaml:"port"` // a number or a port name
	} `yaml:"httpGet"`
	TCPSocket any `yaml:"tcpSocket"`
	Exec      any `yaml:"exec"`
	GRPC      any `yaml:"grpc"`
}

// kubeEnv is one environment variable of a container.
type kubeEnv struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"secretKeyRef"`
		FieldRef *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

// podName stands in for a fieldRef to metadata.name (the relay id).
const podName = "outbox-relay-5d8f7c9b4-x2k7q"

type kubeContainer struct {
	Name    string    `yaml:"name"`
	Image   string    `yaml:"image"`
	Command []string  `yaml:"command"`
	Args    []string  `yaml:"args"`
	Env     []kubeEnv `yaml:"env"`
	EnvFrom []any     `yaml:"envFrom"`
	Ports   []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe  *kubeProbe `yaml:"readinessProbe"`
	LivenessProbe   *kubeProbe `yaml:"livenessProbe"`
	StartupProbe    *kubeProbe `yaml:"startupProbe"`
	SecurityContext struct {
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	} `yaml:"securityContext"`
}

type kubeDeployment struct {
	Kind string `yaml:"kind"`
	Spec struct {
		Replicas int          `yaml:"replicas"`
		Selector kubeSelector `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				TerminationGracePeriodSeconds *int64 `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               struct {
					RunAsNonRoot *bool  `yaml:"runAsNonRoot"`
					RunAsUser    *int64 `yaml:"runAsUser"`
				} `yaml:"securityContext"`
				Containers []kubeContainer `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// readKube decodes deploy/kubernetes/name into v and checks its kind.
func readKube(t *testing.T, name, kind string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(kubeDir, name))
	if err != nil {
		t.Fatal(err)
	}
	var head struct {
		Kind string `yaml:"kind"`
	}
	if err := yaml.Unmarshal(b, &head); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if head.Kind != kind {
		t.Fatalf("%s: kind %q; want %s", name, head.Kind, kind)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// kubeWorker is the worker's container of deploy/kubernetes/deployment.yaml.
func kubeWorker(t *testing.T) (kubeDeployment, kubeContainer) {
	t.Helper()
	var d kubeDeployment
	readKube(t, "deployment.yaml", "Deployment", &d)
	cs := d.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("deployment.yaml: %d containers; want the worker's", len(cs))
	}
	c := cs[0]
	if len(c.Command) > 0 || len(c.EnvFrom) > 0 {
		t.Fatalf("deployment.yaml: command %q, envFrom %v; want the image's entrypoint with args, and env by name (checkable here)", c.Command, c.EnvFrom)
	}
	return d, c
}

// kubeProbes returns the container's httpGet probes by kind, their ports
// resolved to numbers; any other kind of probe is an error.
func kubeProbes(t *testing.T, c kubeContainer) map[string]struct {
	path string
	port int
} {
	t.Helper()
	out := map[string]struct {
		path string
		port int
	}{}
	for kind, p := range map[string]*kubeProbe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe, "startupProbe": c.StartupProbe} {
		if p == nil {
			continue
		}
		if p.HTTPGet == nil || p.TCPSocket != nil || p.Exec != nil || p.GRPC != nil {
			t.Errorf("deployment.yaml: %s is not an httpGet probe (the image has no shell, and the worker answers HTTP)", kind)
			continue
		}
		port := containerPort(c, p.HTTPGet.Port.Value)
		if port == 0 {
			t.Errorf("deployment.yaml: %s port %q is not a port of the container", kind, p.HTTPGet.Port.Value)
			continue
		}
		out[kind] = struct {
			path string
			port int
		}{p.HTTPGet.Path, port}
	}
	return out
}

// containerPort resolves a port number or name of c; 0 if c has no such
// port.
func containerPort(c kubeContainer, port string) int {
	for _, p := range c.Ports {
		if p.Name == port || strconv.Itoa(p.ContainerPort) == port {
			return p.ContainerPort
		}
	}
	return 0
}

// kubeGetenv is the container's environment as the worker would see it:
// plain values, and for a Secret reference a stand-in of the right form.
func kubeGetenv(t *testing.T, c kubeContainer) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret-" + e.ValueFrom.SecretKeyRef.Key
			if e.Name == envName("db-dsn") {
				env[e.Name] = "host=db.invalid user=relay dbname=app" // a DSN every driver's parser accepts
			}
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = podName
		case e.ValueFrom != nil:
			t.Errorf("deployment.yaml: %s: valueFrom other than a secretKeyRef or the pod's name", e.Name)
		default:
			env[e.Name] = e.Value
		}
	}
	return env
}

// isSelected says whether selector's labels are all in labels.
func isSelected(selector kubeSelector, labels map[string]string) bool {
	if len(selector.MatchLabels) == 0 {
		return false
	}
	for k, v := range selector.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestKubernetesManifestsConfigureTheWorkerItAccepts: the Deployment's
// args are flags of the worker and its variables OUTBOX_* variables of its
// flags (or the Go runtime's); together they make a configuration the
// worker accepts (the Secret's values standing in), listening on every
// interface at the port the probes and the PodMonitor use; the DSN and the
// SASL password come from the Secret; terminationGracePeriodSeconds
// outlasts the worker's stop (-stop-timeout, then the HTTP server's
// shutdown); the pod runs as the Dockerfile's non-root user with a
// read-only root file system; the PodDisruptionBudget and the PodMonitor
// select the Deployment's pods; the kustomization lists every manifest.
func TestKubernetesManifestsConfigureTheWorkerItAccepts(t *testing.T) {
	d, c := kubeWorker(t)
	flags := newFlagSet(&config{})
	if err := flags.Parse(c.Args); err != nil {
		t.Errorf("deployment.yaml: args %q: %v", c.Args, err)
	} else if flags.NArg() > 0 {
		t.Errorf("deployment.yaml: args %q: %q is not a flag", c.Args, flags.Arg(0))
	}
	for _, e := range c.Env {
		if err := workerReads(flags, e.Name); err != nil {
			t.Errorf("deployment.yaml: env %s: %v", e.Name, err)
		}
		secret := e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil
		if (e.Name == envName("db-dsn") || e.Name == envName("kafka-sasl-password")) && !secret {
			t.Errorf("deployment.yaml: %s is a plain value; want it from a Secret", e.Name)
		}
	}
	for _, a := range c.Args {
		if strings.Contains(a, "dsn") || strings.Contains(a, "password") {
			t.Errorf("deployment.yaml: args %q: want the DSN and the password from a Secret, through the environment", a)
		}
	}
	env := kubeGetenv(t, c)
	cfg, err := parseConfig(c.Args, func(name string) string { return env[name] })
	if err != nil {
		t.Fatalf("deployment.yaml: the worker rejects the configuration: %v", err)
	}

	host, port, _ := strings.Cut(cfg.listen, ":")
	if host != "" {
		t.Errorf("deployment.yaml: -listen %q; want :PORT, every interface (the default, %s, is unreachable from the kubelet and the scraper)", cfg.listen, defaultListen)
	}
	n, _ := strconv.Atoi(port)
	probes := kubeProbes(t, c)
	if probes["readinessProbe"].path != "/healthz" {
		t.Errorf("deployment.yaml: readinessProbe %+v; want /healthz (ready while the relay runs)", probes["readinessProbe"])
	}
	if _, ok := probes["livenessProbe"]; !ok {
		t.Errorf("deployment.yaml: no livenessProbe")
	}
	for kind, p := range probes {
		if p.port != n {
			t.Errorf("deployment.yaml: %s on port %d; the worker listens on %s", kind, p.port, cfg.listen)
		}
	}

	spec := d.Spec.Template.Spec
	stop := cfg.relay.StopTimeout + httpShutdownTimeout
	if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= stop {
		t.Errorf("deployment.yaml: terminationGracePeriodSeconds %s; want more than -stop-timeout %v plus the HTTP server's shutdown %v", jsonOf(g), cfg.relay.StopTimeout, httpShutdownTimeout)
	}
	if sc := spec.SecurityContext; sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("deployment.yaml: pod securityContext %+v; want runAsNonRoot and a non-root runAsUser", sc)
	} else {
		stages := readDockerfile(t)
		for _, in := range stages[len(stages)-1].instrs {
			if uid, _, _ := strings.Cut(in.args, ":"); in.cmd == "USER" && uid != strconv.FormatInt(*sc.RunAsUser, 10) {
				t.Errorf("deployment.yaml: runAsUser %d; the Dockerfile's USER is %s", *sc.RunAsUser, in.args)
			}
		}
	}
	if sc := c.SecurityContext; sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("deployment.yaml: container securityContext: want readOnlyRootFilesystem true and allowPrivilegeEscalation false")
	}

	labels := d.Spec.Template.Metadata.Labels
	if !isSelected(d.Spec.Selector, labels) {
		t.Errorf("deployment.yaml: selector %v does not select the pod labels %v", d.Spec.Selector.MatchLabels, labels)
	}
	var pdb struct {
		Spec struct {
			MinAvailable   any          `yaml:"minAvailable"`
			MaxUnavailable any          `yaml:"maxUnavailable"`
			Selector       kubeSelector `yaml:"selector"`
		} `yaml:"spec"`
	}
	readKube(t, "poddisruptionbudget.yaml", "PodDisruptionBudget", &pdb)
	if !isSelected(pdb.Spec.Selector, labels) || (pdb.Spec.MinAvailable == nil) == (pdb.Spec.MaxUnavailable == nil) {
		t.Errorf("poddisruptionbudget.yaml: selector %v, minAvailable %v, maxUnavailable %v; want the worker's pods and one of the bounds", pdb.Spec.Selector.MatchLabels, pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable)
	}
	var pm struct {
		Spec struct {
			Selector  kubeSelector `yaml:"selector"`
			Endpoints []struct {
				Port string `yaml:"port"`
				Path string `yaml:"path"`
			} `yaml:"podMetricsEndpoints"`
		} `yaml:"spec"`
	}
	readKube(t, "podmonitor.yaml", "PodMonitor", &pm)
	if !isSelected(pm.Spec.Selector, labels) || len(pm.Spec.Endpoints) != 1 {
		t.Fatalf("podmonitor.yaml: selector %v, %d endpoints; want the worker's pods, one endpoint", pm.Spec.Selector.MatchLabels, len(pm.Spec.Endpoints))
	}
	if ep := pm.Spec.Endpoints[0]; containerPort(c, ep.Port) != n || ep.Path != "/metrics" {
		t.Errorf("podmonitor.yaml: scrapes port %q path %q; want the worker's port (%s) and /metrics", ep.Port, ep.Path, cfg.listen)
	}

	var kust struct {
		Resources []string `yaml:"resources"`
	}
	readKube(t, "kustomization.yaml", "Kustomization", &kust)
	files, err := filepath.Glob(filepath.Join(kubeDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			want = append(want, b)
		}
	}
	if got := slices.Sorted(slices.Values(kust.Resources)); !slices.Equal(got, want) {
		t.Errorf("kustomization.yaml: resources %q; want every manifest %q", got, want)
	}
}

// buildAsDockerfile runs the Dockerfile's go build, as written but for its
// -o path, at the repository root with the build stage's environment, and
// returns the binary.
func buildAsDockerfile(t *testing.T, b dockerBuild) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "outbox-relay")
	argv := slices.Clone(b.argv)
	for i := range argv[:len(argv)-1] {
		if argv[i] == "-o" {
			argv[i+1] = bin
		}
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goBin, argv[1:]...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), b.env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's %s: %v\n%s", strings.Join(b.argv, " "), err, out)
	}
	return bin
}

// argGroups splits args into each flag with its value, as fs parses them.
func argGroups(fs *flag.FlagSet, args []string) (names []string, groups [][]string) {
	for i := 0; i < len(args); i++ {
		name, _, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		g := []string{args[i]}
		f := fs.Lookup(name)
		isBool := false
		if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok {
			isBool = bf.IsBoolFlag()
		}
		if !hasValue && !isBool && i+1 < len(args) {
			i++
			g = append(g, args[i])
		}
		names = append(names, name)
		groups = append(groups, g)
	}
	return names, groups
}

// servicesFlag says whether the test replaces the manifest's setting of
// the flag: where the database and the brokers are and how to reach them,
// the listen address (a free local port), and the log format (the test
// reads JSON lines).
func servicesFlag(name string) bool {
	switch name {
	case "db-driver", "db-dsn", "kafka-brokers", "notify-postgres-dsn", "listen", "log-format":
		return true
	}
	return strings.HasPrefix(name, "kafka-tls") || strings.HasPrefix(name, "kafka-sasl")
}

// TestDeployProbesAnswerOnTheWorkerTheDockerfileBuilds builds the worker
// with the Dockerfile's own go build, finds every flag and variable of the
// Deployment in that binary's `help flags`, runs it with the Deployment's
// settings (the database, the brokers and the listen address replaced by
// the test's SQLite file, in-process broker and a free local port), and
// GETs every probe path and the PodMonitor's scrape path: each answers
// 200, readiness once the relay runs. SIGTERM then stops the worker with
// exit 0 within terminationGracePeriodSeconds.
func TestDeployProbesAnswerOnTheWorkerTheDockerfileBuilds(t *testing.T) {
	d, c := kubeWorker(t)
	bin := buildAsDockerfile(t, readDockerBuild(t, readDockerfile(t)))

	// The binary's own list of its flags and variables.
	out, err := exec.Command(bin, "help", "flags").Output()
	if err != nil {
		t.Fatalf("outbox-relay help flags: %v", err)
	}
	listed := map[string]bool{}
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) == 2 && strings.HasPrefix(f[0], "-") && strings.HasPrefix(f[1], "[") {
			listed[f[0]], listed[strings.Trim(f[1], "[]")] = true, true
		}
	}
	flags := newFlagSet(&config{})
	if err := flags.Parse(c.Args); err != nil {
		t.Fatalf("deployment.yaml: args %q: %v", c.Args, err)
	}
	names, groups := argGroups(flags, c.Args)
	for _, name := range names {
		if !listed["-"+name] {
			t.Errorf("deployment.yaml: -%s is not in outbox-relay help flags", name)
		}
	}
	var args, env []string
	for i, name := range names {
		if !servicesFlag(name) {
			args = append(args, groups[i]...)
		}
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, envPrefix) && !listed[e.Name] {
			t.Errorf("deployment.yaml: %s is not in outbox-relay help flags", e.Name)
		}
		if strings.HasPrefix(e.Name, envPrefix) && servicesFlag(strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(e.Name, envPrefix), "_", "-"))) {
			continue
		}
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env = append(env, e.Name+"="+podName)
		case e.ValueFrom != nil:
			t.Fatalf("deployment.yaml: %s comes from a Secret but is not a connection setting this test replaces", e.Name)
		default:
			env = append(env, e.Name+"="+e.Value)
		}
	}

	broker := testenv.NewFake(t)
	dsn := "file:" + filepath.Join(t.TempDir(), "outbox.db") + "?_busy_timeout=5000&_journal_mode=WAL&_txlock=immediate"
	args = append(args, "-db-driver", "sqlite", "-db-dsn", dsn, "-migrate",
		"-kafka-brokers", strings.Join(broker.Addrs, ","), "-listen", "127.0.0.1:0", "-log-format", "json")
	w := startWorker(t, bin, args, env...)

	paths := map[string]string{}
	for kind, p := range kubeProbes(t, c) {
		paths[kind] = p.path
	}
	var pm struct {
		Spec struct {
			Endpoints []struct {
				Path string `yaml:"path"`
			} `yaml:"podMetricsEndpoints"`
		} `yaml:"spec"`
	}
	readKube(t, "podmonitor.yaml", "PodMonitor", &pm)
	for _, ep := range pm.Spec.Endpoints {
		paths["podmonitor.yaml"] = ep.Path
	}
	for _, where := range slices.Sorted(maps.Keys(paths)) {
		path := paths[where]
		var code int
		var body string
		eventually(t, where+" "+path+" answers 200", w.logs, func() bool {
			code, body = get("http://" + w.addr + path)
			return code == 200
		})
		t.Logf("%s: GET %s: %d %.40q", where, path, code, body)
	}

	start := time.Now()
	w.terminate(t)
	if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil && time.Since(start) >= time.Duration(*g)*time.Second {
		t.Errorf("the worker took %v to stop after SIGTERM; terminationGracePeriodSeconds is %ds", time.Since(start), *g)
	}
}
