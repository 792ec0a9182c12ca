package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/gormstore"
	"github.com/gorm-outbox/outbox/kafkapub"
	"github.com/gorm-outbox/outbox/pgnotify"
	"github.com/gorm-outbox/outbox/relay"
)

// envPrefix prefixes every flag's variable: -db-dsn is OUTBOX_DB_DSN.
const envPrefix = "OUTBOX_"

// defaultListen is the default -listen: the loopback interface only, so a
// worker started by hand does not expose its metrics to the network.
const defaultListen = "127.0.0.1:9090"

// dbConfig is the database configuration the relay shares with the
// subcommands.
type dbConfig struct {
	dbDriver         string
	dbDSN            string
	outbox           outbox.Config
	statementTimeout time.Duration // gormstore.Options.StatementTimeout
	readOnly         bool          // a read-only subcommand's: SQLite opened with mode=ro
}

// config is the worker's whole configuration.
type config struct {
	dbConfig
	migrate bool

	kafka         kafkapub.Config       // without Transport and Transactions, which build adds
	txn           kafkapub.Transactions // Outbox empty: the default (non-transactional) mode
	clientID      string
	tlsEnable     bool
	tlsCA         string
	tlsCert       string
	tlsKey        string
	tlsServerName string
	tlsSkipVerify bool
	saslMechanism string
	saslUser      string
	saslPassword  string

	relay relay.Options

	notifyDSN     string
	notifyChannel string

	listen    string
	logFormat string
	logLevel  string
}

func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// newFlagSet declares every flag into c.
func newFlagSet(c *config) *flag.FlagSet {
	fs := flag.NewFlagSet("outbox-relay", flag.ContinueOnError)
	fs.SetOutput(io.Discard)

	dbFlags(fs, &c.dbConfig)
	fs.BoolVar(&c.migrate, "migrate", false, "create or update the outbox tables (outbox.AutoMigrate) at start")

	fs.Func("kafka-brokers", "comma-separated Kafka bootstrap addresses, each host:port (required)", func(s string) error {
		b, err := parseBrokers(s)
		if err != nil {
			return err
		}
		c.kafka.Brokers = b
		return nil
	})
	fs.StringVar(&c.clientID, "kafka-client-id", "outbox-relay", "Kafka client id")
	fs.BoolVar(&c.tlsEnable, "kafka-tls", false, "connect to Kafka with TLS (implied by any other -kafka-tls-* flag)")
	fs.StringVar(&c.tlsCA, "kafka-tls-ca", "", "PEM file of the CA certificates that verify the brokers (default: the system pool)")
	fs.StringVar(&c.tlsCert, "kafka-tls-cert", "", "PEM client certificate file for mutual TLS (with -kafka-tls-key)")
	fs.StringVar(&c.tlsKey, "kafka-tls-key", "", "PEM client key file for mutual TLS (with -kafka-tls-cert)")
	fs.StringVar(&c.tlsServerName, "kafka-tls-server-name", "", "server name to verify in the brokers' certificates (default: from the address)")
	fs.BoolVar(&c.tlsSkipVerify, "kafka-tls-insecure-skip-verify", false, "do not verify the brokers' certificates (testing only)")
	fs.StringVar(&c.saslMechanism, "kafka-sasl-mechanism", "", "SASL mechanism: plain, scram-sha-256 or scram-sha-512 (default: no SASL)")
	fs.StringVar(&c.saslUser, "kafka-sasl-username", "", "SASL user name")
	fs.StringVar(&c.saslPassword, "kafka-sasl-password", "", "SASL password (prefer the environment variable)")
	fs.StringVar(&c.kafka.MessageIDHeader, "message-id-header", kafkapub.DefaultMessageIDHeader, "record header carrying the message id")
	intVar(fs, &c.kafka.BatchBytes, "kafka-batch-bytes", kafkapub.DefaultBatchBytes, "largest produce request per partition, in bytes; keep it at most the topics' max.message.bytes")
	intVar(fs, &c.kafka.MaxBatchRecords, "kafka-max-batch-records", kafkapub.DefaultMaxBatchRecords, "largest number of records per partition per produce request")
	durationVar(fs, &c.kafka.PublishTimeout, "kafka-publish-timeout", kafkapub.DefaultPublishTimeout, "timeout of one publish call to Kafka: a call that takes longer fails, and the relay counts, logs and retries it after -error-backoff; keep it well under -lease-duration")
	fs.StringVar(&c.txn.Outbox, "kafka-transactions", "", "fenced publishing (opt-in): publish each batch in a Kafka transaction, one transactional producer per bucket, so a relay that lost its bucket cannot write to read_committed consumers; the value names this outbox in the transactional ids (<prefix><name>-<bucket>), unique to the outbox across the Kafka cluster and the same on all its relays; consumers must read with isolation.level=read_committed (empty: off)")
	fs.StringVar(&c.txn.IDPrefix, "kafka-transactional-id-prefix", kafkapub.DefaultTransactionalIDPrefix, "with -kafka-transactions: the transactional ids' prefix (the relay's principal needs WRITE and DESCRIBE on TransactionalId resources with this prefix)")
	durationVar(fs, &c.txn.Timeout, "kafka-transaction-timeout", kafkapub.DefaultTransactionTimeout, "with -kafka-transactions: transaction.timeout.ms; longer than -kafka-publish-timeout, at most the brokers' transaction.max.timeout.ms")

	o := &c.relay
	intVar(fs, &o.BatchSize, "batch-size", relay.DefaultBatchSize, "rows fetched and published per batch")
	intVar(fs, &o.MaxBatchBytes, "max-batch-bytes", relay.DefaultMaxBatchBytes, "bound on a batch in bytes (keys, values and headers); a larger row is published alone")
	intVar(fs, &o.MaxConcurrentBuckets, "max-concurrent-buckets", 0, "batches served at once on PostgreSQL and MySQL (SQLite: one); a fleet runs relays × it against the database (0: the default, min(4, ⌈8 × buckets owned ÷ -bucket-count⌉))")
	durationVar(fs, &o.PollInterval, "poll-interval", relay.DefaultPollInterval, "how often to look for pending rows without a hint")
	durationVar(fs, &o.ErrorBackoff, "error-backoff", relay.DefaultErrorBackoff, "wait after a store error; first backoff of a failing row")
	durationVar(fs, &o.LeaseDuration, "lease-duration", relay.DefaultLeaseDuration, "lifetime of an acquired or renewed bucket lease")
	durationVar(fs, &o.LeaseRenewInterval, "lease-renew-interval", relay.DefaultLeaseRenewInterval, "rebalance and renewal cadence; shorter than -lease-duration")
	durationVar(fs, &o.MaxPublishDuration, "max-publish-duration", 0, "an assertion, not a timeout: a publish call that takes longer stops the relay with a misconfiguration error (exit 1); must exceed -kafka-publish-timeout and, plus -lease-renew-interval, stay under -lease-duration (0: no assertion)")
	fs.StringVar(&o.RelayID, "relay-id", "", "relay id in the lease table, unique among live relays (default: host name plus a random suffix)")
	fs.StringVar(&o.MetricsName, "metrics-name", relay.DefaultMetricsName, "value of the outbox.name metric attribute")
	durationVar(fs, &o.MetricsInterval, "metrics-interval", relay.DefaultMetricsInterval, "wait between backlog queries")
	durationVar(fs, &o.MetricsTimeout, "metrics-timeout", relay.DefaultMetricsTimeout, "bound on one backlog query")
	fs.Func("park-policy", "which publish failures park a row: unpublishable (the broker rejects the row as stored: too large, invalid, no such partition or topic, not authorised; an outage parks nothing), never (retry forever) or any-failure (default unpublishable)", func(s string) error {
		for _, p := range []relay.ParkPolicy{relay.ParkUnpublishable, relay.ParkNever, relay.ParkAnyFailure} {
			if s == p.String() {
				o.ParkPolicy = p
				return nil
			}
		}
		return fmt.Errorf("%q is not unpublishable, never or any-failure", s)
	})
	intVar(fs, &o.ParkAfter, "park-after", relay.DefaultParkAfter, "consecutive counted failures of a row published alone before it is parked (see -park-policy)")
	durationVar(fs, &o.PublishFailureWindow, "publish-failure-window", relay.DefaultPublishFailureWindow, "/healthz reports 503 once every publish has failed for longer than this")
	fs.BoolVar(&o.MetricsBacklog, "metrics-backlog", true, "sample the backlog (pending count, oldest age) every -metrics-interval with one query; false: no backlog gauges and no such query")
	fs.BoolVar(&o.MetricsBucketZeroOnly, "metrics-bucket-zero-only", false, "only the owner of bucket 0 samples the backlog (set on every relay)")
	durationVar(fs, &o.StopTimeout, "stop-timeout", relay.DefaultStopTimeout, "bound on the cleanup after SIGTERM (in-flight publish, lease release)")
	refuseZero(fs, "kafka-batch-bytes", "kafka-max-batch-records", "kafka-publish-timeout", "kafka-transaction-timeout",
		"batch-size", "max-batch-bytes", "poll-interval", "error-backoff", "lease-duration", "lease-renew-interval",
		"metrics-interval", "metrics-timeout", "park-after", "publish-failure-window", "stop-timeout")

	fs.StringVar(&c.notifyDSN, "notify-postgres-dsn", "", "PostgreSQL connection string for cross-process wake-ups over LISTEN/NOTIFY (package pgnotify; empty: polling only)")
	fs.StringVar(&c.notifyChannel, "notify-channel", pgnotify.DefaultChannel, "LISTEN/NOTIFY channel, the same as the writers' pgnotify.Sender")

	fs.StringVar(&c.listen, "listen", defaultListen, "address host:port of the HTTP server for /metrics and /healthz (empty: no server); the default serves this host only: use -listen :9090 to expose it to a Kubernetes probe or a Prometheus scraper")
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return fs
}

// dbFlags declares the database flags, the relay's and every subcommand's,
// into c.
func dbFlags(fs *flag.FlagSet, c *dbConfig) {
	fs.StringVar(&c.dbDriver, "db-driver", "", "database driver: postgres, mysql or sqlite (required)")
	fs.StringVar(&c.dbDSN, "db-dsn", "", "database DSN in the driver's form (required)")
	intVar(fs, &c.outbox.BucketCount, "bucket-count", 0, fmt.Sprintf("ordering buckets, 1 to %d: the fleet's count, the lease table's rows, which the writers' outbox.Config.BucketCount must equal; a relay with another count is refused (0: the table's, or %d on an empty table, which the first relay or -migrate then seeds)", outbox.MaxBucketCount, outbox.DefaultBucketCount))
	fs.StringVar(&c.outbox.Schema, "schema", "", "schema (PostgreSQL), database (MySQL) or attached database (SQLite) of the tables (default: the connection's)")
	fs.StringVar(&c.outbox.MessagesTable, "messages-table", outbox.DefaultMessagesTable, "pending messages table")
	fs.StringVar(&c.outbox.LeasesTable, "leases-table", outbox.DefaultLeasesTable, "bucket lease table")
	fs.StringVar(&c.outbox.RelaysTable, "relays-table", outbox.DefaultRelaysTable, "relay heartbeat table")
	durationVar(fs, &c.statementTimeout, "statement-timeout", gormstore.DefaultStatementTimeout, "bound on every store statement (a table locked by a migration, a stuck connection); keep it well under -lease-renew-interval; on SQLite also set _busy_timeout in the DSN")
	refuseZero(fs, "statement-timeout")
}

// parseConfig reads args and the environment, and checks the result.
func parseConfig(args []string, getenv func(string) string) (*config, error) {
	c := &config{}
	if err := parseFlags(newFlagSet(c), args, getenv, nil); err != nil {
		return nil, err
	}
	return c, c.check()
}

// parseFlags parses args into fs, then sets every flag not given on the
// command line from its OUTBOX_* variable, if set (only, when not nil,
// names the flags read from the environment). It returns flag.ErrHelp for
// -h; other errors name the flag or the variable.
func parseFlags(fs *flag.FlagSet, args []string, getenv func(string) string, only map[string]bool) error {
	if err := fs.Parse(args); err != nil {
		return flagParseError(err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || given[f.Name] || (only != nil && !only[f.Name]) {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %v", envName(f.Name), v, e)
			}
		}
	})
	return err
}

// flagError matches the flag package's message for a rejected value.
var flagError = regexp.MustCompile(`^invalid (boolean )?value "(.*)" for (?:flag )?-(\S+): (.*)$`)

// flagParseError puts the flag package's error for a rejected value in the
// form of every other error: -flag "value": why.
func flagParseError(err error) error {
	m := flagError.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	why := m[4]
	if m[1] != "" {
		why = "want true or false"
	}
	return fmt.Errorf("-%s %q: %s", m[3], m[2], why)
}

// durationValue is a time.Duration flag whose errors say what is wrong
// (the flag package's says "parse error"), a bare number the usual mistake.
type durationValue time.Duration

func durationVar(fs *flag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var((*durationValue)(p), name, usage+" (a duration with a unit, e.g. 500ms, 5s, 2m)")
}

func (v *durationValue) String() string { return (*time.Duration)(v).String() }

func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err == nil {
		*v = durationValue(d)
		return nil
	}
	if _, ferr := strconv.ParseFloat(s, 64); ferr == nil {
		return fmt.Errorf("a duration needs a unit: use a unit, e.g. %ss", s)
	}
	return errors.New("not a duration: use a number with a unit, e.g. 5s, 500ms or 2m")
}

// positive is a number or duration flag that refuses 0: its option would
// take 0 for its default. A negative value is left to the option's check.
type positive struct {
	flag.Value
	def string
}

// refuseZero makes the named flags of fs positive.
func refuseZero(fs *flag.FlagSet, names ...string) {
	for _, name := range names {
		f := fs.Lookup(name)
		f.Value = positive{f.Value, f.DefValue}
	}
}

func (v positive) Set(s string) error {
	if err := v.Value.Set(s); err != nil {
		return err
	}
	if z := v.String(); z == "0" || z == "0s" {
		return fmt.Errorf("must be positive; leave it unset for the default, %s", v.def)
	}
	return nil
}

// intValue is an int or int64 flag whose errors say what is wrong.
type intValue[T int | int64] struct{ p *T }

func intVar[T int | int64](fs *flag.FlagSet, p *T, name string, def T, usage string) {
	*p = def
	fs.Var(intValue[T]{p}, name, usage)
}

func (v intValue[T]) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.FormatInt(int64(*v.p), 10)
}

func (v intValue[T]) Set(s string) error {
	n, err := strconv.ParseInt(s, 0, 64)
	if errors.Is(err, strconv.ErrRange) || int64(T(n)) != n {
		return errors.New("out of range")
	}
	if err != nil {
		return errors.New("not an integer")
	}
	*v.p = T(n)
	return nil
}

// parseBrokers parses -kafka-brokers: a comma-separated list of host:port,
// with no empty entry (a doubled or trailing comma is a typo, not a list).
func parseBrokers(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("empty: want host:port[,host:port...]")
	}
	parts := strings.Split(s, ",")
	out := make([]string, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("entry %d is empty", i+1)
		}
		host, port, err := net.SplitHostPort(p)
		if err != nil {
			return nil, fmt.Errorf("%q is not host:port", p)
		}
		if host == "" {
			return nil, fmt.Errorf("%q has no host", p)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return nil, fmt.Errorf("%q: port must be a number from 1 to 65535", p)
		}
		out = append(out, p)
	}
	return out, nil
}

// checkListen checks -listen: empty, or host:port with an empty host (every
// interface) and port 0 (any free port) allowed.
func checkListen(addr string) error {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-listen %q: want host:port or :port (empty: no server)", addr)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("-listen %q: port must be a number from 0 to 65535", addr)
	}
	return nil
}

// checkDSN parses -db-dsn the way the driver will, so that a malformed DSN
// is a configuration error (exit 2). The DSN may hold a password: it is not
// repeated.
func checkDSN(driver, dsn string) error {
	var err error
	switch driver {
	case "mysql":
		_, err = mysqldrv.ParseDSN(dsn)
	case "postgres":
		_, err = pgx.ParseConfig(dsn)
	}
	if err != nil {
		return fmt.Errorf("-db-dsn (%s): %w", driver, err)
	}
	return nil
}

// rule is a check of the configuration: when broken, err is the error.
type rule struct {
	broken bool
	err    string
}

// firstBroken returns the error of the first broken rule, or nil.
func firstBroken(rules ...rule) error {
	for _, r := range rules {
		if r.broken {
			return errors.New(r.err)
		}
	}
	return nil
}

// check reports the first invalid setting the relay and publisher would not
// report themselves (they are checked by relay.New and kafkapub.New).
func (c *config) check() error {
	if err := c.dbConfig.checkConnection(); err != nil {
		return err
	}
	mpd, pt := c.relay.MaxPublishDuration, c.kafka.PublishTimeout
	if err := firstBroken(
		rule{len(c.kafka.Brokers) == 0, "-kafka-brokers is required"},
		rule{!slices.Contains([]string{"", "plain", "scram-sha-256", "scram-sha-512"}, c.saslMechanism),
			fmt.Sprintf("-kafka-sasl-mechanism %q: must be plain, scram-sha-256 or scram-sha-512", c.saslMechanism)},
		rule{c.saslMechanism != "" && c.saslUser == "", "-kafka-sasl-username is required with -kafka-sasl-mechanism " + c.saslMechanism},
		rule{(c.tlsCert == "") != (c.tlsKey == ""), "-kafka-tls-cert and -kafka-tls-key go together"},
		rule{pt < 0, fmt.Sprintf("-kafka-publish-timeout %q: must not be negative", pt.String())},
		rule{c.txn.Outbox == "" && c.txn.IDPrefix != kafkapub.DefaultTransactionalIDPrefix, "-kafka-transactional-id-prefix goes with -kafka-transactions"},
		rule{c.txn.Outbox == "" && c.txn.Timeout != kafkapub.DefaultTransactionTimeout, "-kafka-transaction-timeout goes with -kafka-transactions"},
		rule{mpd > 0 && pt >= mpd, fmt.Sprintf("-kafka-publish-timeout %v must be shorter than -max-publish-duration %v: a publish to a hung broker would stop the relay", pt, mpd)},
		rule{c.logFormat != "text" && c.logFormat != "json", fmt.Sprintf("-log-format %q: must be text or json", c.logFormat)},
	); err != nil {
		return err
	}
	if _, err := parseLevel(c.logLevel); err != nil {
		return err
	}
	if err := checkListen(c.listen); err != nil {
		return err
	}
	if err := c.outbox.Validate(); err != nil {
		return err
	}
	if c.notifyDSN != "" {
		if _, err := pgnotify.New(pgnotify.Config{ConnString: c.notifyDSN, Channel: c.notifyChannel}); err != nil {
			return fmt.Errorf("-notify-postgres-dsn/-notify-channel: %w", err)
		}
	}
	return c.checkRelayOptions()
}

// checkConnection checks the database driver, DSN and statement timeout.
func (c *dbConfig) checkConnection() error {
	if err := firstBroken(
		rule{c.dbDriver == "", "-db-driver is required (postgres, mysql or sqlite)"},
		rule{!slices.Contains([]string{"postgres", "mysql", "sqlite"}, c.dbDriver), fmt.Sprintf("-db-driver %q: must be postgres, mysql or sqlite", c.dbDriver)},
		rule{c.statementTimeout < 0, fmt.Sprintf("-statement-timeout %q: must not be negative", c.statementTimeout.String())},
		rule{c.dbDSN == "", "-db-dsn is required"},
	); err != nil {
		return err
	}
	return checkDSN(c.dbDriver, c.dbDSN)
}

func (c *dbConfig) check() error {
	if err := c.checkConnection(); err != nil {
		return err
	}
	return c.outbox.Validate()
}

// transport returns kafka-go's Transport with the TLS and SASL settings.
func (c *config) transport() (*kafka.Transport, error) {
	t := &kafka.Transport{ClientID: c.clientID}
	if c.tlsEnable || c.tlsCA != "" || c.tlsCert != "" || c.tlsServerName != "" || c.tlsSkipVerify {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.tlsServerName, InsecureSkipVerify: c.tlsSkipVerify} //nolint:gosec // opt-in flag
		if c.tlsCA != "" {
			pem, err := os.ReadFile(c.tlsCA)
			if err != nil {
				return nil, fmt.Errorf("-kafka-tls-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("-kafka-tls-ca %s: no PEM certificate found", c.tlsCA)
			}
			tc.RootCAs = pool
		}
		if c.tlsCert != "" {
			cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
			if err != nil {
				return nil, fmt.Errorf("-kafka-tls-cert/-kafka-tls-key: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		t.TLS = tc
	}
	var mech sasl.Mechanism
	var err error
	switch c.saslMechanism {
	case "plain":
		mech = plain.Mechanism{Username: c.saslUser, Password: c.saslPassword}
	case "scram-sha-256":
		mech, err = scram.Mechanism(scram.SHA256, c.saslUser, c.saslPassword)
	case "scram-sha-512":
		mech, err = scram.Mechanism(scram.SHA512, c.saslUser, c.saslPassword)
	}
	if err != nil {
		return nil, fmt.Errorf("-kafka-sasl-mechanism %s: %w", c.saslMechanism, err)
	}
	t.SASL = mech
	return t, nil
}

// usage is `outbox-relay -h`: the commands and the most common flags.
func usage(w io.Writer) {
	fmt.Fprintf(w, `outbox-relay publishes the rows of a gorm-outbox outbox table to Kafka.

Usage: outbox-relay [flags]            run the relay; SIGTERM or SIGINT stops it gracefully
       outbox-relay COMMAND [flags]    an operator's command (below)
       outbox-relay help flags         every flag of the relay, with its variable

`)
	subcommandsUsage(w)
	fmt.Fprintf(w, "Common flags (each also read from the variable shown; the command line wins):\n")
	fs := newFlagSet(&config{})
	for _, name := range []string{"db-driver", "db-dsn", "kafka-brokers", "migrate", "listen", "log-format"} {
		printFlag(w, fs.Lookup(name))
	}
	fmt.Fprintf(w, `
Exit status: 0 after a graceful stop; 2 for bad configuration (one line
naming the flag, before any connection); 1 for a runtime failure.
`)
}

// flagsUsage is `outbox-relay help flags`: every flag of the relay.
func flagsUsage(w io.Writer) {
	fmt.Fprintf(w, `Usage: outbox-relay [flags]

Runs the relay. Every flag can also be set by the environment variable shown
beside it; a flag on the command line wins. SIGTERM or SIGINT stops the relay
gracefully: it finishes the in-flight batch, releases its bucket leases and
exits 0.

Exit status: 0 after a graceful stop; 2 for bad configuration (one error
line naming the flag, before any connection); 1 for a runtime failure
(database unreachable at start, outbox tables missing without -migrate, the
HTTP address taken, a fatal relay error).

A number or duration of 0 is refused unless the flag says what 0 means:
leave a flag unset for its default.

HTTP (-listen): /metrics (Prometheus format), /healthz (200 while the relay
runs and its last cycle and lease acquisition succeeded, else 503 with the
reason; a publish failure is not reported there, except an authentication
failure or every publish failing for -publish-failure-window, until a
publish is acknowledged again).

Flags:
`)
	newFlagSet(&config{}).VisitAll(func(f *flag.Flag) { printFlag(w, f) })
}

func printFlag(w io.Writer, f *flag.Flag) {
	fmt.Fprintf(w, "  -%s  [%s]\n    \t%s%s\n", f.Name, envName(f.Name), f.Usage, defaultNote(f))
}

// flagNames maps the option names in relay, outbox and publisher errors to
// the flags that set them, so an error names what the user typed.
var flagNames = strings.NewReplacer(
	"Options.BatchSize", "-batch-size",
	"Options.MaxBatchBytes", "-max-batch-bytes",
	"Options.MaxConcurrentBuckets", "-max-concurrent-buckets",
	"Options.PollInterval", "-poll-interval",
	"Options.ErrorBackoff", "-error-backoff",
	"Options.LeaseDuration", "-lease-duration",
	"Options.LeaseRenewInterval", "-lease-renew-interval",
	"Options.MaxPublishDuration", "-max-publish-duration",
	"Options.RelayID", "-relay-id",
	"Options.MetricsName", "-metrics-name",
	"Options.MetricsInterval", "-metrics-interval",
	"Options.MetricsTimeout", "-metrics-timeout",
	"Options.MetricsBacklog", "-metrics-backlog",
	"Options.PublishFailureWindow", "-publish-failure-window",
	"Options.ParkPolicy", "-park-policy",
	"Options.ParkAfter", "-park-after",
	"Options.MetricsBucketZeroOnly", "-metrics-bucket-zero-only",
	"Options.StopTimeout", "-stop-timeout",
	"Options.BucketCount", "-bucket-count",
	"Config.BucketCount", "-bucket-count",
	"Config.Schema", "-schema",
	"Config.MessagesTable", "-messages-table",
	"Config.LeasesTable", "-leases-table",
	"Config.RelaysTable", "-relays-table",
	"Config.Brokers", "-kafka-brokers",
	"Config.BatchBytes", "-kafka-batch-bytes",
	"Config.MaxBatchRecords", "-kafka-max-batch-records",
	"Config.PublishTimeout", "-kafka-publish-timeout",
	"Transactions.Outbox", "-kafka-transactions",
	"Transactions.Timeout", "-kafka-transaction-timeout",
	"\n", "; ",
)

// oneLine returns err's message on one line, with option names replaced by
// their flags.
func oneLine(err error) string { return flagNames.Replace(err.Error()) }

// checkStore stands in for the database store while relay.New checks the
// relay options, before any connection is made: it reads only the bucket
// count, and nothing else is ever called.
type checkStore struct {
	relay.Store
	buckets int
}

func (s checkStore) BucketCount() int { return s.buckets }

// checkRelayOptions runs relay.New's validation of the relay options
// without a database.
func (c *config) checkRelayOptions() error {
	opts := c.relay
	opts.BucketCount = c.outbox.WithDefaults().BucketCount
	opts.Logger = slog.New(slog.DiscardHandler)
	_, err := relay.New(checkStore{buckets: opts.BucketCount}, relay.PublishFunc(nil), opts)
	return err
}
