package kafkapub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/kafkapub/internal/wire"
	"github.com/gorm-outbox/outbox/relay"
)

// Kafka publisher defaults.
const (
	// DefaultMessageIDHeader is the record header that carries a row's
	// message id (36-character lowercase UUID text).
	DefaultMessageIDHeader = "x-outbox-message-id"
	// DefaultBatchBytes is the default largest produce request the
	// publisher sends to one partition, kafka-go's own default (1 MiB).
	DefaultBatchBytes = 1 << 20
	// DefaultMaxBatchRecords is the default largest number of records
	// the publisher sends to one partition in one produce request.
	DefaultMaxBatchRecords = 1000
	// DefaultPublishTimeout is the default bound on one Publish call
	// (Config.PublishTimeout): kafka-go's own per-request default, one
	// third of the relay's default 30 s lease.
	DefaultPublishTimeout = 10 * time.Second
)

// ErrClosed is the error of every row of a Publish called after
// (*Publisher).Close.
var ErrClosed = errors.New("kafkapub: publisher closed")

// Config configures New. Brokers is required; the zero value of every
// other field means its default.
type Config struct {
	// Brokers are the bootstrap addresses ("host:port"). Required: an empty
	// list or an empty address fails New.
	Brokers []string

	// Transport carries the writer's requests: a *kafka.Transport with TLS,
	// SASL, dial and metadata settings, or any kafka.RoundTripper. It is
	// passed to the writer untouched and the caller keeps ownership (Close
	// does not close it). Nil means the Transport the Configure hook set on
	// the writer, else a default kafka.Transport owned by the publisher.
	Transport kafka.RoundTripper

	// MessageIDHeader is the header that carries each row's message id as
	// 36-character lowercase text. Caller headers of that name are dropped
	// and the stamped header comes last. Empty means DefaultMessageIDHeader.
	MessageIDHeader string

	// BatchBytes is the largest produce request to one partition, in
	// kafka-go's accounting of record sizes: a partition's rows beyond it go
	// in several requests, in sequence. A row larger than BatchBytes fails
	// unsent with an error matching kafka.MessageSizeTooLarge and
	// relay.ErrUnpublishable. Keep it at most the topics' max.message.bytes:
	// the broker rejects a larger request and the publisher then splits it.
	// Zero means the BatchBytes the Configure hook set on the writer, else
	// DefaultBatchBytes (1 MiB); negative fails New.
	BatchBytes int64

	// MaxBatchRecords is the largest number of records the publisher sends
	// to one partition in one produce request. Zero means
	// DefaultMaxBatchRecords (1000); negative fails New.
	MaxBatchRecords int

	// PublishTimeout bounds one Publish call (in the transactional mode,
	// each batch's transaction): when the broker has not answered within it
	// (a paused, hung or unreachable broker), Publish returns the rows
	// acknowledged so far and, for the first other row, an error wrapping
	// context.DeadlineExceeded that names this field, so that the relay
	// counts, logs and retries it. It is also the writer's WriteTimeout, the
	// bound of each produce request, so a write still in flight when Publish
	// returns ends within it. Keep it well under the relay's lease
	// (relay.Options.LeaseDuration). Zero means DefaultPublishTimeout
	// (10 s); negative fails New.
	PublishTimeout time.Duration

	// Configure, when set, runs first on the new writer, which holds the
	// publisher's settings: it may set Compression, WriteTimeout (at most
	// PublishTimeout: zero or longer means PublishTimeout),
	// AllowAutoTopicCreation, Logger, ErrorLogger, Completion and Transport
	// (when the Transport field is nil). The publisher then sets Addr (from
	// Brokers) and RequiredAcks = RequireAll, whatever the hook set, and
	// sends each produce request itself with kafka-go's Client.Produce, one
	// attempt each, telling the writer's Logger, ErrorLogger and Completion
	// of each. The writer's batching, balancing, attempts and Topic are not
	// used: each row names its topic, and the publisher places the rows and
	// sizes the requests.
	Configure func(*kafka.Writer)

	// TracerProvider provides the tracer of the publish spans: one span per
	// Publish call (per batch in the transactional mode), of kind PRODUCER,
	// named "send <topic>" ("send" when the rows name several topics), with
	// the OpenTelemetry messaging attributes (messaging.system kafka,
	// messaging.operation.type and .name send, messaging.destination.name
	// for one topic, messaging.destination.partition.id when every row went
	// to one partition, messaging.batch.message_count for several rows,
	// messaging.message.id for one), the error of the first unacknowledged
	// row, and a link to each distinct span context in the rows' headers
	// (the writers' trace contexts, see outbox.Plugin.Propagator), at most
	// MaxPublishSpanLinks, added after the span starts (samplers do not see
	// them). Nil means the OpenTelemetry global, otel.GetTracerProvider(),
	// which records nothing until the application installs an SDK; a span
	// that does not record costs no allocation per row.
	TracerProvider trace.TracerProvider

	// Propagator extracts the trace context from each row's headers, for
	// the publish span's links; use the writers' (outbox.Plugin.Propagator).
	// The publisher sends the headers as stored, so the consumer continues
	// the writer's trace, not the publish span's. Nil means the
	// OpenTelemetry global, otel.GetTextMapPropagator(), which extracts
	// nothing until the application sets one.
	Propagator propagation.TextMapPropagator

	// Transactions, when set, makes the publisher transactional (fenced
	// publishing, opt-in; see Transactions). Nil means the default mode.
	Transactions *Transactions
}

// Publisher is the relay.Publisher built on kafka-go: acks=all, murmur2
// key placement (explicit partitions honoured), the message-id header on
// every record, and each partition's records in submission order across
// partial failure. With Config.Transactions it publishes in Kafka
// transactions instead (fenced publishing: see Transactions, which also
// says how its requests, retries and duplicates differ from what follows).
//
// Publish groups its rows by topic partition and sends every partition's
// rows at once, each partition's as one produce request (several, in
// sequence, beyond BatchBytes or MaxBatchRecords). A produce request is
// atomic on the broker, and once a row routed to partition P fails, no
// later row of the call is sent to P: a consumer that deduplicates by
// message id sees each partition's records in submission order even when a
// row is rejected and retried later. When the broker rejects a request for
// a reason that belongs to one record (MESSAGE_TOO_LARGE, INVALID_RECORD,
// CORRUPT_MESSAGE, RECORD_LIST_TOO_LARGE) the publisher resends its rows in
// halves, in order, so that the rows before the culprit are still
// acknowledged and the error names the culprit. Any other failed request is
// not retried inside the publisher: the error goes back to the relay, which
// counts it (outbox.publish.failures), logs it and retries with its backoff.
//
// Duplicates: when the broker appended a request but its acknowledgement
// was lost (a broker paused or restarted after the append, a connection
// cut, a PublishTimeout that fired first), the retry sends the rows again,
// so a consumer sees the same message id twice or more. The copies follow
// each other in the partition, separated at most by rows of the same
// retried batches, and deduplication by message id restores the submission
// order. A write still in flight when Publish returns keeps its partition
// until it ends, so a retry cannot overtake it.
//
// Calls on different partitions run concurrently; calls that share a
// partition share its requests: one request is in flight per partition,
// and the rows of every call that arrived meanwhile go out together in the
// next, each call's in its submission order and the calls in order of
// arrival. A Publisher is safe for concurrent use.
type Publisher struct {
	w            *kafka.Writer
	header       string
	timeout      time.Duration // PublishTimeout
	batchBytes   int64
	maxRecords   int
	ownTransport *kafka.Transport
	tracing      publishTracer
	txn          *Transactions // with defaults; nil: the default mode

	mu        sync.Mutex
	closed    bool
	lanes     map[topicPartition]*lane
	producers map[int]*txnProducer // the owned buckets' (transactional mode)
	wg        sync.WaitGroup       // Publish calls and background goroutines
}

var _ relay.Publisher = (*Publisher)(nil)

// topicPartition names one partition of a topic.
type topicPartition = wire.TopicPartition

// New returns a publisher writing to cfg.Brokers. It does not
// contact the brokers; connections open on the first Publish. An invalid
// cfg is an error naming the field.
func New(cfg Config) (*Publisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("kafkapub: Config.Brokers is empty")
	}
	for i, b := range cfg.Brokers {
		if strings.TrimSpace(b) == "" {
			return nil, fmt.Errorf("kafkapub: Config.Brokers[%d] is empty", i)
		}
	}
	if cfg.BatchBytes < 0 {
		return nil, fmt.Errorf("kafkapub: Config.BatchBytes is negative (%d)", cfg.BatchBytes)
	}
	if cfg.MaxBatchRecords < 0 {
		return nil, fmt.Errorf("kafkapub: Config.MaxBatchRecords is negative (%d)", cfg.MaxBatchRecords)
	}
	if cfg.PublishTimeout < 0 {
		return nil, fmt.Errorf("kafkapub: Config.PublishTimeout is negative (%v)", cfg.PublishTimeout)
	}
	p := &Publisher{
		header:     cmp.Or(cfg.MessageIDHeader, DefaultMessageIDHeader),
		timeout:    cmp.Or(cfg.PublishTimeout, DefaultPublishTimeout),
		maxRecords: cmp.Or(cfg.MaxBatchRecords, DefaultMaxBatchRecords),
		lanes:      make(map[topicPartition]*lane),
		tracing:    newPublishTracer(cfg.TracerProvider, cfg.Propagator),
	}
	if cfg.Transactions != nil {
		tc, err := cfg.Transactions.check(p.timeout)
		if err != nil {
			return nil, err
		}
		p.txn, p.producers = &tc, map[int]*txnProducer{}
	}

	w := &kafka.Writer{}
	if cfg.Configure != nil {
		cfg.Configure(w)
	}
	p.batchBytes = cmp.Or(cfg.BatchBytes, w.BatchBytes)
	if p.batchBytes <= 0 {
		p.batchBytes = DefaultBatchBytes
	}
	if cfg.Transport != nil {
		w.Transport = cfg.Transport
	} else if w.Transport == nil {
		p.ownTransport = &kafka.Transport{}
		w.Transport = p.ownTransport
	}
	w.Addr = kafka.TCP(cfg.Brokers...)
	w.RequiredAcks = kafka.RequireAll
	if w.WriteTimeout <= 0 || w.WriteTimeout > p.timeout {
		w.WriteTimeout = p.timeout
	}
	p.w = w
	return p, nil
}

// Publish implements relay.Publisher: results[i] is batches[i]'s outcome,
// its contiguous acknowledged prefix and the error of its first
// unacknowledged row (a zero Result for an empty batch, ErrClosed for every
// other batch after Close). The error wraps kafka-go's, so errors.Is(res.Err,
// kafka.MessageSizeTooLarge) and the like work. It also wraps
// relay.ErrUnpublishable, so that the relay's default
// relay.Options.ParkPolicy parks the row, when it will recur for the row as
// stored: the row alone is too large for the topic or BatchBytes, or
// invalid (CORRUPT_MESSAGE, INVALID_RECORD); its topic is empty, invalid
// or not writable by the relay (TOPIC_AUTHORIZATION_FAILED); or it names a
// partition its topic does not have. Transient errors (leaders, timeouts,
// replicas, the network, an unknown topic) never wrap it. Refused
// credentials (SASL_AUTHENTICATION_FAILED, UNSUPPORTED_SASL_MECHANISM,
// ILLEGAL_SASL_STATE) wrap relay.ErrPublisherAuth, which the relay's
// Health reports.
//
// When ctx is done, or Config.PublishTimeout has passed, Publish stops
// waiting and reports only the rows acknowledged so far, with ctx's error
// (or the timeout's, wrapping context.DeadlineExceeded) for the first
// other row. A row already handed to the broker may still be appended
// after that.
//
// In the default mode the rows of all batches go out as one call's, under
// one PublishTimeout and one span: the request to a partition carries the
// rows of every batch placed there, in the order of batches, so that many
// shallow buckets cost one round of requests rather than one each. A failed
// row stops its partition for the rest of the call; a later row of another
// batch there is then not acknowledged, and its batch's error names the
// failed row and wraps that row's error unless it wraps
// relay.ErrUnpublishable or relay.ErrPublisherAuth (the fault is not its
// row's).
//
// In the transactional mode each batch is published in its own
// transaction, the batches of different buckets concurrently; batches of
// one bucket go in order, and a batch after one of its bucket that failed
// is not sent (its error says so).
func (p *Publisher) Publish(ctx context.Context, batches [][]*outbox.Message) []relay.Result {
	results := make([]relay.Result, len(batches))
	n := 0
	for _, b := range batches {
		n += len(b)
	}
	if n == 0 {
		return results
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		for i, b := range batches {
			if len(b) > 0 {
				results[i].Err = ErrClosed
			}
		}
		return results
	}
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()
	if p.txn != nil {
		p.publishTxn(ctx, batches, results) // see Transactions
		return results
	}
	p.publishRows(ctx, batches, n, results)
	return results
}

// publishRows is Publish in the default mode; batches hold n rows.
func (p *Publisher) publishRows(ctx context.Context, batches [][]*outbox.Message, n int, results []relay.Result) {
	all := batches[0]
	if len(all) != n {
		all = make([]*outbox.Message, 0, n)
		for _, b := range batches {
			all = append(all, b...)
		}
	}
	ctx, span := p.tracing.start(ctx, all)
	ctx, cancel := p.withTimeout(ctx, "broker")
	defer cancel()

	rows := make([]row, 0, n)
	for bi, b := range batches {
		for _, m := range b {
			rows = append(rows, row{msg: p.record(m), id: m.MessageID, partition: -1, batch: bi})
		}
	}

	groups, order := p.place(ctx, all, rows)

	// Every partition at once, the last (often the only one) on this
	// goroutine.
	var wg sync.WaitGroup
	for i, key := range order {
		if i == len(order)-1 {
			p.publishPartition(ctx, key, rows, groups[key])
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.publishPartition(ctx, key, rows, groups[key])
		}()
	}
	wg.Wait()
	if len(batches) > 1 {
		blame(rows, groups, order)
	}

	var first error
	off := 0
	for i, b := range batches {
		if len(b) > 0 {
			results[i] = outcome(ctx, rows[off:off+len(b)])
		}
		off += len(b)
		if first == nil {
			first = results[i].Err
		}
	}
	p.tracing.end(span, rows, first)
}

// withTimeout bounds ctx by Config.PublishTimeout, whose expiry is an
// error naming the field and who did not answer.
func (p *Publisher) withTimeout(ctx context.Context, who string) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, p.timeout,
		fmt.Errorf("no answer from the %s within Config.PublishTimeout (%v): %w", who, p.timeout, context.DeadlineExceeded))
}

// blame gives each row that a failed row of another batch left
// unacknowledged on their partition (publishPartition stops at a partition's
// first failure, and a failed request fails every row it carried) a
// *blockedError naming the failed row.
func blame(rows []row, groups map[topicPartition][]int, order []topicPartition) {
	for _, key := range order {
		var failed *row
		for _, i := range groups[key] {
			r := &rows[i]
			switch {
			case r.acked:
			case r.err != nil:
				if failed == nil {
					failed = r
				}
			case failed != nil && failed.batch != r.batch:
				r.err = &blockedError{failed.id, failed.err, r.sent}
			}
		}
	}
}

// blockedError is the error of a row that was not acknowledged because an
// earlier row of another batch on the same partition failed (see
// Publish). It wraps that row's error only when the error is not about
// that row or the publisher's credentials, so that it never matches
// relay.ErrUnpublishable or relay.ErrPublisherAuth.
type blockedError struct {
	failed outbox.UUID // the failed row's message id
	err    error       // its error
	sent   bool        // the row was in a request that failed
}

func (e *blockedError) Error() string {
	if e.sent {
		return fmt.Sprintf("not acknowledged: its produce request failed at an earlier row of the partition, message %s of another bucket's batch: %v", e.failed, e.err)
	}
	return fmt.Sprintf("not sent: an earlier row of the same partition, message %s of another bucket's batch, failed: %v", e.failed, e.err)
}

func (e *blockedError) Unwrap() error {
	if errors.Is(e.err, relay.ErrUnpublishable) || errors.Is(classifyAuth(e.err), relay.ErrPublisherAuth) {
		return nil
	}
	return e.err
}

// outcome is the relay.Result of rows (one batch's) that ended: the
// contiguous acknowledged prefix, and the error of the first other row.
func outcome(ctx context.Context, rows []row) relay.Result {
	for i := range rows {
		r := &rows[i]
		if r.acked {
			continue
		}
		err := r.err
		if err == nil {
			err = context.Cause(ctx)
		}
		if err == nil { // unreachable: every unacknowledged row has a cause
			err = errors.New("not acknowledged")
		}
		err = classifyAuth(err)
		where := r.msg.Topic
		if r.partition >= 0 {
			where = fmt.Sprintf("%s[%d]", r.msg.Topic, r.partition)
		}
		return relay.Result{Acknowledged: i, Err: fmt.Errorf("kafkapub: publish message %s to %s: %w", r.id, where, err)}
	}
	return relay.Result{Acknowledged: len(rows)}
}

// row is one message of a Publish call and its outcome.
type row struct {
	msg       kafka.Message
	id        outbox.UUID
	partition int
	batch     int  // index of the row's batch in its Publish call
	sent      bool // handed to the writer (acknowledged or not)
	acked     bool
	err       error
}

// record converts m to a kafka-go message: key, value and headers as stored,
// plus the message-id header.
func (p *Publisher) record(m *outbox.Message) kafka.Message {
	hs := make([]kafka.Header, 0, len(m.Headers)+1)
	for _, h := range m.Headers {
		if h.Key == p.header {
			continue
		}
		hs = append(hs, kafka.Header{Key: h.Key, Value: h.Value})
	}
	hs = append(hs, kafka.Header{Key: p.header, Value: []byte(m.MessageID.String())})
	return kafka.Message{Topic: m.Topic, Key: m.Key, Value: m.Value, Headers: hs}
}

// place decides every row's partition and groups the rows by topic
// partition, each group in submission order; order lists the groups. A row
// that cannot be placed gets its error.
func (p *Publisher) place(ctx context.Context, batch []*outbox.Message, rows []row) (map[topicPartition][]int, []topicPartition) {
	type count struct {
		n   int
		err error
	}
	counts := make(map[string]count) // per topic
	groups := make(map[topicPartition][]int)
	var order []topicPartition
	var parts []int
	for i, m := range batch {
		if m.Topic == "" {
			rows[i].err = unpublishable(errors.New("the row has no topic"))
			continue
		}
		c, seen := counts[m.Topic]
		if !seen {
			c.n, c.err = p.client().Partitions(ctx, m.Topic, p.w.AllowAutoTopicCreation)
			counts[m.Topic] = c
		}
		n := c.n
		if c.err != nil {
			rows[i].err = classify(c.err, true)
			continue
		}
		var part int
		if m.Partition != nil {
			part = int(*m.Partition)
			if part < 0 || part >= n {
				// Not the writer's business: its balancer would place the
				// row on another partition. The row names a partition the
				// topic does not have: it fails alone, as stored.
				rows[i].err = unpublishable(fmt.Errorf("partition %d does not exist (the topic has %d): %w", part, n, kafka.UnknownTopicOrPartition))
				continue
			}
		} else {
			for len(parts) < n {
				parts = append(parts, len(parts))
			}
			part = kafka.Murmur2Balancer{}.Balance(kafka.Message{Key: m.Key}, parts[:n]...)
		}
		rows[i].partition = part
		rows[i].msg.Partition = part
		key := topicPartition{Topic: m.Topic, Partition: part}
		order = appendGroup(groups, order, key, i)
	}
	return groups, order
}

// appendGroup appends v to key's group, and key to order when it is new.
func appendGroup[K comparable, V any](groups map[K][]V, order []K, key K, v V) []K {
	if _, ok := groups[key]; !ok {
		order = append(order, key)
	}
	groups[key] = append(groups[key], v)
	return order
}

// client sends the publisher's own requests on the writer's transport.
func (p *Publisher) client() wire.Client {
	return wire.Client{Transport: p.w.Transport, Addr: p.w.Addr}
}

// recordError reports whether the broker rejected a request because of one
// of its records, so that nothing was appended and a smaller request may
// succeed.
func recordError(err error) bool {
	return wire.Is(err, kafka.MessageSizeTooLarge, kafka.RecordListTooLarge, kafka.InvalidRecord, kafka.InvalidMessage) // InvalidMessage is CORRUPT_MESSAGE
}

// unpublishableError is a row's publish error that will recur for the row
// as stored: it matches relay.ErrUnpublishable as well as the original
// error, and reads as the original.
type unpublishableError struct{ err error }

func (e *unpublishableError) Error() string   { return e.err.Error() }
func (e *unpublishableError) Unwrap() []error { return []error{e.err, relay.ErrUnpublishable} }

func unpublishable(err error) error { return &unpublishableError{err} }

// tooLarge is the error of a record of n bytes, more than BatchBytes.
func (p *Publisher) tooLarge(n int64) error {
	return unpublishable(fmt.Errorf("record of %d bytes exceeds BatchBytes %d: %w", n, p.batchBytes, kafka.MessageSizeTooLarge))
}

// authError is a publish error that says the broker rejected the
// publisher's credentials: it matches relay.ErrPublisherAuth as well as the
// original error, and reads as the original.
type authError struct{ err error }

func (e *authError) Error() string   { return e.err.Error() }
func (e *authError) Unwrap() []error { return []error{e.err, relay.ErrPublisherAuth} }

// classifyAuth returns err wrapping relay.ErrPublisherAuth when the broker
// rejected the publisher's credentials (SASL_AUTHENTICATION_FAILED,
// UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE), else err itself.
func classifyAuth(err error) error {
	if err != nil && !errors.Is(err, relay.ErrPublisherAuth) &&
		wire.Is(err, kafka.SASLAuthenticationFailed, kafka.UnsupportedSASLMechanism, kafka.IllegalSASLState) {
		return &authError{err}
	}
	return err
}

// classify returns err wrapping relay.ErrUnpublishable when it will recur
// for the row as stored, whatever the retry (see Publish), else err itself:
// a topic Kafka cannot have or the relay may not write
// (INVALID_TOPIC_EXCEPTION, TOPIC_AUTHORIZATION_FAILED: fix the ACL, then
// requeue), and a recordError when alone says that the failed request held
// this row only (the publisher resends a rejected request in halves down to
// one row), so that the error is the row's and not a batching effect.
// Everything else is transient: leaders moving, timeouts, missing replicas,
// the network, and UNKNOWN_TOPIC_OR_PARTITION from the broker (a topic
// being created).
func classify(err error, alone bool) error {
	if err == nil || errors.Is(err, relay.ErrUnpublishable) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return err
	}
	if wire.Is(err, kafka.InvalidTopic, kafka.TopicAuthorizationFailed) || alone && recordError(err) {
		return unpublishable(err)
	}
	return err
}

// Close waits for in-flight Publish calls and writes (a write abandoned by
// its caller's ctx ends within Config.PublishTimeout), and closes the
// connections of the transport the publisher created. A Publish after
// Close fails with ErrClosed. Close is idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
	if p.txn != nil { // retire the producers, as if the relay had stopped owning them
		p.mu.Lock()
		p.retireProducers(func(int) bool { return true })
		p.mu.Unlock()
		p.wg.Wait()
	}
	if p.ownTransport != nil {
		p.ownTransport.CloseIdleConnections()
	}
	return nil
}
