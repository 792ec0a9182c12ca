package wire

import (
	"context"
	"fmt"
	"net"
	"slices"

	"github.com/segmentio/kafka-go"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
)

// Client sends requests on a transport to a cluster.
type Client struct {
	// Transport carries the requests (the writer's).
	Transport kafka.RoundTripper
	// Addr are the cluster's bootstrap addresses (the writer's Addr).
	Addr net.Addr
}

// TopicPartition names one partition of a topic.
type TopicPartition struct {
	Topic     string
	Partition int
}

// RoundTrip sends req and returns the broker's answer.
func (c Client) RoundTrip(ctx context.Context, req kafka.Request) (kafka.Response, error) {
	return c.Transport.RoundTrip(ctx, c.Addr, req)
}

// Error is the error of a response's error code and message: nil for 0,
// else the kafka.Error of code, with msg after it when it is not empty.
func Error(code int16, msg *string) error {
	if code == 0 {
		return nil
	}
	if msg != nil && *msg != "" {
		return fmt.Errorf("%w: %s", kafka.Error(code), *msg)
	}
	return kafka.Error(code)
}

// Partitions returns topic's partition count from the transport's (cached)
// metadata, as kafka-go's writer itself looks it up; allowAutoCreate is the
// writer's AllowAutoTopicCreation.
func (c Client) Partitions(ctx context.Context, topic string, allowAutoCreate bool) (int, error) {
	res, err := c.RoundTrip(ctx, &metadataAPI.Request{
		TopicNames:             []string{topic},
		AllowAutoTopicCreation: allowAutoCreate,
	})
	if err != nil {
		return 0, fmt.Errorf("metadata: %w", err)
	}
	meta, ok := res.(*metadataAPI.Response)
	if !ok {
		return 0, fmt.Errorf("metadata: unexpected response %T", res)
	}
	for _, t := range meta.Topics {
		if t.Name != topic {
			continue
		}
		if t.ErrorCode != 0 {
			return 0, fmt.Errorf("metadata: %w", kafka.Error(t.ErrorCode))
		}
		if len(t.Partitions) == 0 {
			return 0, fmt.Errorf("metadata: %w", kafka.LeaderNotAvailable)
		}
		return len(t.Partitions), nil
	}
	return 0, fmt.Errorf("metadata: %w", kafka.UnknownTopicOrPartition)
}

// Leaders returns the leader broker of each partition from the transport's
// (cached) metadata; -1 where it does not know.
func (c Client) Leaders(ctx context.Context, parts []TopicPartition) map[TopicPartition]int32 {
	out := make(map[TopicPartition]int32, len(parts))
	var topics []string
	for _, tp := range parts {
		out[tp] = -1
		if !slices.Contains(topics, tp.Topic) {
			topics = append(topics, tp.Topic)
		}
	}
	res, err := c.RoundTrip(ctx, &metadataAPI.Request{TopicNames: topics})
	if err != nil {
		return out
	}
	meta, ok := res.(*metadataAPI.Response)
	if !ok {
		return out
	}
	for _, t := range meta.Topics {
		for _, pt := range t.Partitions {
			tp := TopicPartition{t.Name, int(pt.PartitionIndex)}
			if _, ok := out[tp]; ok && pt.ErrorCode == 0 {
				out[tp] = pt.LeaderID
			}
		}
	}
	return out
}
