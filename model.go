package outbox

import (
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
	"gorm.io/gorm/schema"
)

// Default table names. Config overrides each of them.
const (
	DefaultMessagesTable = "outbox_messages"
	DefaultLeasesTable   = "outbox_leases"
	DefaultRelaysTable   = "outbox_relays"
)

// MaxParkedReasonLength is the width, in characters, of the messages
// table's parked_reason column.
const MaxParkedReasonLength = 1000

// MaxTopicLength is the longest topic name Kafka accepts, and the width of
// the topic column.
const MaxTopicLength = 249

// Message is one pending Kafka record, written in the caller's transaction
// and deleted by a relay after the broker acknowledged it. Callers set
// Topic, Key, Value, Headers and optionally Partition; Create fills the rest.
type Message struct {
	// ID is the auto-increment primary key: submission order within a
	// bucket. Create fills it unless the Plugin has SkipIDReadBack set.
	ID int64 `gorm:"column:id;primaryKey;autoIncrement;index:,composite:bucket_parked_id,priority:3"`
	// MessageID is the record's stable identity, its message-id header.
	// Create generates one when it is zero, the same again for a retried
	// transaction (see docs/writing.md); a caller's is kept.
	MessageID UUID `gorm:"column:message_id;not null"`
	// Bucket is the ordering bucket (BucketOf), computed on create.
	Bucket int32 `gorm:"column:bucket;not null;index:,composite:bucket_parked_id,priority:1"`
	// kept: see generated (placed here, it fills Bucket's padding).
	kept int32
	// Topic is the Kafka topic: 1 to MaxTopicLength characters.
	Topic string `gorm:"column:topic;size:249;not null"`
	// Key is the record key; nil means keyless.
	Key []byte `gorm:"column:record_key"`
	// Value is the record value; nil means a tombstone.
	Value []byte `gorm:"column:record_value"`
	// Headers are the record headers, in order, duplicates allowed.
	Headers Headers `gorm:"column:headers"`
	// Partition, when non-nil, pins the record to that partition and decides
	// its bucket. It must not be negative.
	Partition *int32 `gorm:"column:record_partition"`
	// CreatedAt is when the row was enqueued (UTC); set on create when zero.
	CreatedAt time.Time `gorm:"column:created_at;not null"`
	// ParkedAtMs is set by the relay only (relay.Store.Park): when the row
	// was parked, in Unix milliseconds; nil for a pending row.
	ParkedAtMs *int64 `gorm:"column:parked_at_ms;<-:false;index:,composite:bucket_parked_id,priority:2"`
	// ParkedReason is set by the relay only, with ParkedAtMs: why the row
	// was parked (at most MaxParkedReasonLength characters).
	ParkedReason *string `gorm:"column:parked_reason;size:1000;<-:false"`

	// generated is the last MessageID the plugin put in this struct. The
	// creates of a struct in the transaction under way form a run: kept is
	// how many of them stand (not rolled back), -1 once the run ended
	// (committed, or beyond the plugin's sight: settle). ids are the run's
	// message ids by position, nil while it has at most one (generated).
	generated UUID
	ids       *[]UUID
	// traced is the Headers slice the trace-context injection left, nil
	// when it injected nothing; tracedFrom is how many are the caller's.
	traced     Headers
	tracedFrom int
}

// TableName returns the default table name; the Plugin routes statements
// to the configured one (see Plugin).
func (Message) TableName() string { return DefaultMessagesTable }

// BeforeCreate does the Plugin's work for a message created without the
// Plugin registered; with it, it does nothing.
func (m *Message) BeforeCreate(tx *gorm.DB) error {
	if _, done := tx.Statement.Settings.Load(preparedKey); done {
		return nil
	}
	cfg, err := configFrom(tx)
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	route(tx.Statement, cfg)
	if err := cfg.prepare(m, time.Now(), false); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	newTraceInjector(tx.Statement.Context, nil).inject(tx.Statement.Context, m)
	return nil
}

// AfterCreate records that m was written, so that creating the struct again
// generates a new MessageID (see MessageID).
func (m *Message) AfterCreate(*gorm.DB) error {
	m.settle()
	return nil
}

// idAt returns the message id of the create at position k of m's run
// (see Message.generated), zero when there was none.
func (m *Message) idAt(k int) UUID {
	switch {
	case m.kept < 0:
		return UUID{} // the run ended
	case m.ids != nil && k < len(*m.ids):
		return (*m.ids)[k]
	case m.ids == nil && k == 0:
		return m.generated
	}
	return UUID{}
}

// setAt records id as the message id of the create at position k of m's
// run; it runs before generated takes a new id.
func (m *Message) setAt(k int, id UUID) {
	switch {
	case k == 0 && m.ids == nil:
		// generated holds it (a caller's id needs no keeping)
	case m.ids == nil:
		m.ids = &[]UUID{m.generated, id} // k == 1: a second create
	case k < len(*m.ids):
		(*m.ids)[k] = id
	default:
		*m.ids = append(*m.ids, id)
	}
}

// settle ends m's run of creates: they are committed (or beyond the
// plugin's sight), so its next create is a new record.
func (m *Message) settle() {
	m.kept, m.ids = -1, nil
}

// BucketLease is one bucket's lease: which relay owns it and until when.
type BucketLease struct {
	// Bucket is the bucket number, 0 to BucketCount-1.
	Bucket int32 `gorm:"column:bucket;primaryKey;autoIncrement:false"`
	// Owner is the relay id holding the lease, or nil.
	Owner *string `gorm:"column:owner;size:128"`
	// ExpiresAtMs is the lease expiry in Unix milliseconds (UTC); 0 = free.
	ExpiresAtMs int64 `gorm:"column:expires_at_ms;not null"`
}

// TableName returns the default table name.
func (BucketLease) TableName() string { return DefaultLeasesTable }

// RelayHeartbeat is one relay's heartbeat.
type RelayHeartbeat struct {
	// RelayID identifies the relay instance.
	RelayID string `gorm:"column:relay_id;primaryKey;size:128"`
	// LastSeenMs is the last heartbeat in Unix milliseconds (UTC).
	LastSeenMs int64 `gorm:"column:last_seen_ms;not null"`
	// StoppedAtMs is set when the relay stopped gracefully.
	StoppedAtMs *int64 `gorm:"column:stopped_at_ms"`
	// Features is a bit set of what the relay supports (see
	// RelayFeatureParking), written with each heartbeat; 0 from older relays.
	Features int64 `gorm:"column:features;not null;default:0"`
}

// RelayFeatureParking is the RelayHeartbeat.Features bit of a relay that
// skips parked rows.
const RelayFeatureParking int64 = 1

// TableName returns the default table name.
func (RelayHeartbeat) TableName() string { return DefaultRelaysTable }

// UUID is a message id: a github.com/google/uuid UUID stored as a native
// uuid on PostgreSQL and as 36-character lowercase text elsewhere.
type UUID uuid.UUID

// NewUUID returns a random (version 4) UUID.
func NewUUID() UUID { return UUID(uuid.New()) }

// ParseUUID parses the textual forms accepted by uuid.Parse.
func ParseUUID(s string) (UUID, error) {
	u, err := uuid.Parse(s)
	if err != nil {
		return UUID{}, fmt.Errorf("outbox: parse message id %q: %w", s, err)
	}
	return UUID(u), nil
}

// String returns the 36-character lowercase form.
func (u UUID) String() string { return uuid.UUID(u).String() }

// IsZero reports whether u is the all-zero UUID.
func (u UUID) IsZero() bool { return u == UUID{} }

// MarshalText implements encoding.TextMarshaler.
func (u UUID) MarshalText() ([]byte, error) { return uuid.UUID(u).MarshalText() }

// UnmarshalText implements encoding.TextUnmarshaler.
func (u *UUID) UnmarshalText(b []byte) error { return (*uuid.UUID)(u).UnmarshalText(b) }

// Value implements driver.Valuer: the 36-character lowercase text.
func (u UUID) Value() (driver.Value, error) { return u.String(), nil }

// Scan implements sql.Scanner from a string or []byte holding the textual
// form, or 16 raw bytes. NULL is an error: the column is NOT NULL.
func (u *UUID) Scan(src any) error {
	if src == nil {
		return errors.New("outbox: scan message id: NULL")
	}
	if err := (*uuid.UUID)(u).Scan(src); err != nil {
		return fmt.Errorf("outbox: scan message id: %w", err)
	}
	return nil
}

// GormDBDataType gives the column type per database: uuid on PostgreSQL,
// CHAR(36) on MySQL/MariaDB, TEXT on SQLite.
func (UUID) GormDBDataType(db *gorm.DB, _ *schema.Field) string {
	switch db.Dialector.Name() {
	case "postgres":
		return "uuid"
	case "mysql":
		return "char(36)"
	default:
		return "text"
	}
}

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Headers is an ordered list of record headers, stored in the versioned
// binary encoding (version 1):
//
//	byte     version (1)
//	int32 LE count
//	count × { int32 LE key length, UTF-8 key, int32 LE value length (-1 = nil), value }
//
// A nil or empty list is stored as NULL, and NULL scans as nil.
type Headers []Header

// headersV1 is the only header encoding version.
const headersV1 = 1

// ErrCorruptHeaders is wrapped by the error of DecodeHeaders and Headers.Scan
// for a malformed header blob.
var ErrCorruptHeaders = errors.New("corrupt headers")

// EncodeHeaders returns the version 1 encoding of h, or nil for an empty list.
func EncodeHeaders(h Headers) []byte {
	if len(h) == 0 {
		return nil
	}
	n := 5
	for _, x := range h {
		n += 8 + len(x.Key) + len(x.Value)
	}
	b := make([]byte, 0, n)
	b = append(b, headersV1)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(h)))
	for _, x := range h {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(x.Key)))
		b = append(b, x.Key...)
		if x.Value == nil {
			b = binary.LittleEndian.AppendUint32(b, math.MaxUint32) // -1
			continue
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(x.Value)))
		b = append(b, x.Value...)
	}
	return b
}

// DecodeHeaders decodes a version 1 blob; an empty one decodes to nil. A
// malformed one is an error wrapping ErrCorruptHeaders.
func DecodeHeaders(b []byte) (Headers, error) {
	h, err := decodeHeaders(b)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return h, nil
}

func decodeHeaders(b []byte) (Headers, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[0] != headersV1 {
		return nil, fmt.Errorf("%w: unknown version %d", ErrCorruptHeaders, b[0])
	}
	b = b[1:]
	count, b, err := readLen(b, "count")
	if err != nil {
		return nil, err
	}
	// Each header takes at least 8 bytes (two lengths).
	if count > len(b)/8 {
		return nil, fmt.Errorf("%w: count %d exceeds the %d remaining bytes", ErrCorruptHeaders, count, len(b))
	}
	h := make(Headers, 0, count)
	for i := 0; i < count; i++ {
		var kl int
		if kl, b, err = readLen(b, "key length"); err != nil {
			return nil, err
		}
		if kl > len(b) {
			return nil, fmt.Errorf("%w: header %d: key length %d exceeds the %d remaining bytes", ErrCorruptHeaders, i, kl, len(b))
		}
		key := string(b[:kl])
		b = b[kl:]
		if len(b) < 4 {
			return nil, fmt.Errorf("%w: header %d: truncated value length", ErrCorruptHeaders, i)
		}
		vl := int32(binary.LittleEndian.Uint32(b))
		b = b[4:]
		var val []byte
		switch {
		case vl == -1:
		case vl < 0:
			return nil, fmt.Errorf("%w: header %d: negative value length %d", ErrCorruptHeaders, i, vl)
		case int(vl) > len(b):
			return nil, fmt.Errorf("%w: header %d: value length %d exceeds the %d remaining bytes", ErrCorruptHeaders, i, vl, len(b))
		default:
			val = append([]byte{}, b[:vl]...)
			b = b[vl:]
		}
		h = append(h, Header{Key: key, Value: val})
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrCorruptHeaders, len(b))
	}
	return h, nil
}

func readLen(b []byte, what string) (int, []byte, error) {
	if len(b) < 4 {
		return 0, nil, fmt.Errorf("%w: truncated %s", ErrCorruptHeaders, what)
	}
	n := int32(binary.LittleEndian.Uint32(b))
	if n < 0 {
		return 0, nil, fmt.Errorf("%w: negative %s %d", ErrCorruptHeaders, what, n)
	}
	return int(n), b[4:], nil
}

// Value implements driver.Valuer: NULL for a nil or empty list, else the
// version 1 encoding.
func (h Headers) Value() (driver.Value, error) {
	if len(h) == 0 {
		return nil, nil
	}
	return EncodeHeaders(h), nil
}

// Scan implements sql.Scanner. NULL scans as nil; a []byte or string blob is
// decoded; anything else, or a corrupt blob, is an error.
func (h *Headers) Scan(src any) error {
	var b []byte
	switch v := src.(type) {
	case nil:
		*h = nil
		return nil
	case []byte:
		b = v
	case string:
		b = []byte(v)
	default:
		return fmt.Errorf("outbox: scan headers from %T", src)
	}
	d, err := DecodeHeaders(b)
	if err != nil {
		return err
	}
	*h = d
	return nil
}

// GormDataType stores headers as a binary blob on every database.
func (Headers) GormDataType() string { return string(schema.Bytes) }

// BucketOf returns the bucket of a record, in [0, bucketCount):
//   - an explicit partition p → p mod bucketCount;
//   - a non-nil key (an empty key included) → Kafka's murmur2 of the key,
//     exactly as the Java client's partitioner computes it, mod bucketCount;
//   - a nil key → the same hash over the 16 bytes of the message id.
//
// bucketCount 1 (or less) gives 0.
func BucketOf(key []byte, partition *int32, id UUID, bucketCount int) int32 {
	if bucketCount <= 1 {
		return 0
	}
	if partition != nil {
		return int32(int(*partition) % bucketCount)
	}
	if key == nil {
		key = id[:]
	}
	return int32(murmur2Mod(key, bucketCount))
}

// murmur2Mod is (murmur2(key) & 0x7fffffff) % n: the Java client's default
// partitioner (kafka-go's Murmur2Balancer exports no hash).
func murmur2Mod(key []byte, n int) int {
	return int((murmur2(key) & 0x7fffffff) % uint32(n))
}

// murmur2 is Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2),
// verified against published vectors in testdata/murmur2.json.
func murmur2(data []byte) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	h := seed ^ uint32(len(data))
	i := 0
	for ; i+4 <= len(data); i += 4 {
		k := binary.LittleEndian.Uint32(data[i:])
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch tail := data[i:]; len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
