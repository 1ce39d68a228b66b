package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/wiring/roles"
)

// registerKafkaFlags binds the Kafka flags, shared by every role, to c.
// Defaults come from the environment variables named in each flag's help;
// the SASL password is read from PLAYPIPE_KAFKA_PASSWORD only.
func registerKafkaFlags(fs *flag.FlagSet, c *kafkax.Config) {
	fs.Func("brokers", "Kafka seed brokers, comma separated (env PLAYPIPE_BROKERS); required unless --embedded-kafka", func(s string) error {
		c.Brokers = splitList(s)
		return nil
	})
	if v := os.Getenv("PLAYPIPE_BROKERS"); v != "" {
		c.Brokers = splitList(v)
	}
	fs.StringVar(&c.TopicPrefix, "topic-prefix", envDefault("PLAYPIPE_TOPIC_PREFIX", kafkax.DefaultTopicPrefix), "prefix of the topic names: <prefix>.events, .reports, .rejected, .deliveries (env PLAYPIPE_TOPIC_PREFIX)")
	fs.StringVar(&c.SASLMechanism, "kafka-sasl", os.Getenv("PLAYPIPE_KAFKA_SASL"), "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (env PLAYPIPE_KAFKA_SASL); empty for none")
	fs.StringVar(&c.SASLUser, "kafka-user", os.Getenv("PLAYPIPE_KAFKA_USER"), "SASL user (env PLAYPIPE_KAFKA_USER; the password is read from PLAYPIPE_KAFKA_PASSWORD only)")
	c.SASLPassword = os.Getenv("PLAYPIPE_KAFKA_PASSWORD") // env only: never on a command line
	fs.BoolVar(&c.TLS, "kafka-tls", os.Getenv("PLAYPIPE_KAFKA_TLS") == "true", "use TLS to the brokers (env PLAYPIPE_KAFKA_TLS=true)")
	fs.StringVar(&c.TLSCAFile, "kafka-ca", os.Getenv("PLAYPIPE_KAFKA_CA"), "PEM file of CAs to trust for broker TLS (env PLAYPIPE_KAFKA_CA)")
	fs.BoolVar(&c.TLSInsecure, "kafka-tls-insecure", false, "skip broker certificate verification (testing only)")
	fs.BoolVar(&c.Embedded, "embedded-kafka", false, "instead of --brokers: start an embedded in-process Kafka broker on loopback (in memory, NOT durable: records are lost when this process exits; for try-outs)")
	fs.IntVar(&c.EmbeddedPort, "embedded-kafka-port", 0, "with --embedded-kafka: the loopback port of the embedded broker, so other playpipe processes can use it with --brokers 127.0.0.1:<port> (0: a free port)")
	fs.IntVar(&c.Partitions, "partitions", roles.DefaultPartitions, "partitions of topics that playpipe creates")
	fs.IntVar(&c.ReplicationFactor, "replication-factor", roles.DefaultReplicationFactor, "replication factor of topics that playpipe creates (-1: broker default)")
	fs.StringVar(&c.InstanceID, "instance-id", os.Getenv("PLAYPIPE_INSTANCE_ID"),
		"static group membership id of this instance (group.instance.id): stable across its restarts, unique among running instances, e.g. the pod name (env PLAYPIPE_INSTANCE_ID; empty: dynamic membership)")
	c.SessionTimeout = kafkax.DefaultSessionTimeout
	if v := os.Getenv("PLAYPIPE_SESSION_TIMEOUT"); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			c.SessionTimeout = d
		}
	}
	fs.DurationVar(&c.SessionTimeout, "session-timeout", c.SessionTimeout,
		"group session timeout: how long a silent (killed) instance keeps its partitions (env PLAYPIPE_SESSION_TIMEOUT; 6s–300s)")
}

// requireKafka reports a role with neither --brokers nor --embedded-kafka
// (or an invalid Kafka configuration) as a usage error naming the flags
// and, where it is one of them, PLAYPIPE_BROKERS.
func requireKafka(kcfg kafkax.Config) error {
	note := func(err error) error {
		if err == nil {
			return nil
		}
		return fmt.Errorf("%w (env PLAYPIPE_BROKERS counts as --brokers)", err)
	}
	validate := func() error {
		err := kcfg.Validate()
		if err != nil && kcfg.Embedded && len(kcfg.Brokers) > 0 {
			return note(err)
		}
		return err
	}
	return requireServer(validate, func() error { return note(kcfg.RequireBrokers()) }, "kafka")
}
