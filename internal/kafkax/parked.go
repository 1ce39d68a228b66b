package kafkax

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// The contract of <prefix>.parked (the reporter's parked reports): key =
// report id, compacted (only each report's last state counts; a tombstone
// removes it), the entry of a report of reports partition p in partition
// ParkedPartition(p, n) of the topic's n partitions when it is first
// written. Every later write of the report's state (its slow retries'
// states, its tombstone) goes to the partition its entry was read from or
// first written to, and readers read every partition of the topic, so
// entries stay where they are when partitions are added (n changes the
// rule for new entries only).

// ParkedPartition is the partition of <prefix>.parked, of parts, where a
// parked report of reports partition p is first written: the one rule the
// reporter and `playpipe redrive --parked` share.
func ParkedPartition(p, parts int32) int32 {
	if parts <= 0 {
		return 0
	}
	return p % parts
}

// ErrParkedNotCompacted is the error of a <prefix>.parked whose
// cleanup.policy is not compact: deleting its records by age would lose
// parked reports (their entries are the only copy of their state until
// they are final).
var ErrParkedNotCompacted = errors.New("kafka: the parked topic must be compacted (cleanup.policy=compact)")

// EnsureParked creates <prefix>.parked, compacted, with c's partitions
// and replication factor when it does not exist, and checks that it is
// compacted (an error wrapping ErrParkedNotCompacted otherwise). It
// returns the topic's partition count.
func EnsureParked(ctx context.Context, adm *kadm.Client, c Config) (int32, error) {
	topic := c.Topics().Parked
	compact := "compact"
	resp, err := adm.CreateTopic(ctx, int32(max(c.Partitions, 1)), int16(c.ReplicationFactor), map[string]*string{"cleanup.policy": &compact}, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return 0, fmt.Errorf("kafka: create topic %s: %w", topic, err)
	}
	cfgs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("kafka: describe the configuration of %s: %w", topic, err)
	}
	rc, err := cfgs.On(topic, nil)
	if err == nil {
		err = rc.Err
	}
	if err != nil {
		return 0, fmt.Errorf("kafka: describe the configuration of %s: %w", topic, err)
	}
	policy := "delete" // the broker's default
	for _, kv := range rc.Configs {
		if kv.Key == "cleanup.policy" && kv.Value != nil {
			policy = *kv.Value
		}
	}
	if policy != "compact" { // "compact,delete" deletes entries by age too
		return 0, fmt.Errorf("%w: %s has cleanup.policy=%s; set it with kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config cleanup.policy=compact", ErrParkedNotCompacted, topic, policy, topic)
	}
	tds, err := adm.ListTopics(ctx, topic)
	if err == nil {
		err = tds.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("kafka: describe topic %s: %w", topic, err)
	}
	n := int32(len(tds[topic].Partitions))
	if n == 0 {
		return 0, fmt.Errorf("kafka: topic %s has no partitions", topic)
	}
	return n, nil
}
