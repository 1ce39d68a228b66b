package kafkax

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Embedded is an in-process Kafka-protocol broker (kfake) on loopback. It is
// in memory and not durable: a process exit loses every record. It speaks the
// real wire protocol, so franz-go and segmentio/kafka-go clients use it over
// TCP as they would a real cluster (groups and transactions included).
type Embedded struct {
	cluster *kfake.Cluster
	addrs   []string
}

// StartEmbedded starts an embedded broker on a free loopback port with the
// four topics of prefix created with the given number of partitions. Close
// stops it. The binary's --embedded-kafka goes through Ready instead
// (deadcode lists StartEmbedded): testkit/testenv and tools/bench use it.
func StartEmbedded(prefix string, partitions int) (*Embedded, error) {
	return StartEmbeddedOn(prefix, partitions, 0)
}

// StartEmbeddedOn is StartEmbedded on a given loopback port (0: a free one),
// so that other processes can be pointed at it (--brokers 127.0.0.1:port).
func StartEmbeddedOn(prefix string, partitions, port int) (*Embedded, error) {
	if partitions < 1 {
		partitions = 6
	}
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.SeedTopics(int32(partitions), TopicsFor(prefix).Ledger()...),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(partitions),
	)
	if err != nil {
		return nil, fmt.Errorf("kafka: start embedded broker: %w", err)
	}
	e := &Embedded{cluster: c, addrs: c.ListenAddrs()}
	// The parked topic is compacted (EnsureParked refuses it otherwise):
	// created with its configuration, which seeding cannot give.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := EnsureTopics(ctx, Config{Brokers: e.addrs, TopicPrefix: prefix, Partitions: partitions, ReplicationFactor: -1}); err != nil {
		e.Close()
		return nil, fmt.Errorf("kafka: start embedded broker: %w", err)
	}
	return e, nil
}

// Addrs returns the broker addresses, host:port on loopback.
func (e *Embedded) Addrs() []string { return append([]string(nil), e.addrs...) }

// Cluster exposes the kfake cluster for fault injection in tests (the
// binary never injects faults: deadcode lists it).
func (e *Embedded) Cluster() *kfake.Cluster { return e.cluster }

// Close stops the broker; records are gone. Safe to call twice.
func (e *Embedded) Close() {
	if e.cluster != nil {
		e.cluster.Close()
		e.cluster = nil
	}
}

// Ready validates cfg and makes its topics exist. With Embedded it first
// starts the embedded broker (on cfg.EmbeddedPort), warns on log that it is
// in memory and not durable, and points the returned config at it (Brokers
// set, Embedded cleared). With neither Brokers nor Embedded it refuses with
// ErrNoBrokers: there is no silent fallback. The returned stop function stops
// what Ready started (a no-op otherwise).
func Ready(ctx context.Context, cfg Config, log *slog.Logger) (Config, func(), error) {
	stop := func() {}
	if err := cfg.Validate(); err != nil {
		return cfg, stop, err
	}
	if err := cfg.RequireBrokers(); err != nil {
		return cfg, stop, err
	}
	if cfg.Embedded {
		e, err := StartEmbeddedOn(cfg.TopicPrefix, cfg.Partitions, cfg.EmbeddedPort)
		if err != nil {
			return cfg, stop, err
		}
		cfg.Brokers, cfg.Embedded, cfg.EmbeddedPort, stop = e.Addrs(), false, 0, e.Close
		log.Warn("--embedded-kafka: started an embedded in-process Kafka broker (in memory, NOT durable: records are lost when this process exits)",
			"addrs", cfg.Brokers)
	}
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := EnsureTopics(ectx, cfg); err != nil {
		stop()
		return cfg, func() {}, err
	}
	return cfg, stop, nil
}
