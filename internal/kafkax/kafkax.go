// Package kafkax holds the Kafka settings every playpipe role shares: broker
// addresses, SASL and TLS, the topic names (one configurable prefix), the
// franz-go client options built from them, topic creation, and the embedded
// in-process broker, started only when asked for explicitly (Config.Embedded,
// --embedded-kafka): a role with no brokers and no --embedded-kafka refuses
// to start (ErrNoBrokers) instead of silently running on a broker that loses
// every record when the process exits.
//
// A Config is a plain value (cmd/playpipe fills it from flags and the
// environment; the harness and tests by hand): call Validate once, then
// ClientOpts for every client of the role.
package kafkax

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkaconn"
)

// Topics names the topics of the pipeline: the four of the ledger and the
// reporter's parking lot.
type Topics struct {
	Events     string // player events from fleets
	Reports    string // track plays derived by the consumer
	Rejected   string // bad events with their reasons
	Deliveries string // delivery outcomes published by the reporter
	// Parked holds the reports the reporter set aside after their retry
	// budget (compacted, key = report id; a tombstone when a report leaves
	// the lot): its slow retries' state, one partition per reports
	// partition. Not copied to the ledger: the parked Delivery records are.
	Parked string
}

// TopicsFor returns the topic names under prefix ("plays" gives plays.events, …).
func TopicsFor(prefix string) Topics {
	if prefix == "" {
		prefix = DefaultTopicPrefix
	}
	return Topics{
		Events:     prefix + ".events",
		Reports:    prefix + ".reports",
		Rejected:   prefix + ".rejected",
		Deliveries: prefix + ".deliveries",
		Parked:     prefix + ".parked",
	}
}

// All returns every topic name: what EnsureTopics creates and the embedded
// broker seeds.
func (t Topics) All() []string { return append(t.Ledger(), t.Parked) }

// Ledger returns the four topics the analytics sink copies to ClickHouse.
func (t Topics) Ledger() []string { return []string{t.Events, t.Reports, t.Rejected, t.Deliveries} }

// DefaultTopicPrefix is the prefix of the topic names when none is configured.
const DefaultTopicPrefix = "plays"

// SASL mechanisms accepted by Config.SASLMechanism.
const (
	SASLNone        = kafkaconn.SASLNone
	SASLPlain       = kafkaconn.SASLPlain
	SASLScramSHA256 = kafkaconn.SASLScramSHA256
	SASLScramSHA512 = kafkaconn.SASLScramSHA512
)

// Config is the Kafka connection of a role.
type Config struct {
	// Brokers are the seed brokers, host:port. Required unless Embedded.
	Brokers []string
	// Embedded asks for the embedded in-process broker (in memory, not
	// durable) instead of Brokers: flag --embedded-kafka. The two exclude
	// each other; with neither, Ready refuses with ErrNoBrokers.
	Embedded bool
	// TopicPrefix prefixes the four topic names; defaults to "plays".
	TopicPrefix string
	// SASLMechanism is one of "", PLAIN, SCRAM-SHA-256, SCRAM-SHA-512.
	SASLMechanism string
	SASLUser      string
	// SASLPassword is a secret: it is never logged or put in errors.
	SASLPassword string
	// TLS enables TLS to the brokers; TLSCAFile adds a CA bundle (PEM) to trust,
	// TLSInsecure skips verification (testing only).
	TLS         bool
	TLSCAFile   string
	TLSInsecure bool
	// EmbeddedPort is the loopback port of the embedded broker started with
	// Embedded (0: a free port).
	EmbeddedPort int
	// Partitions and ReplicationFactor are used when playpipe creates missing
	// topics (defaults 6 and -1, the broker default).
	Partitions        int
	ReplicationFactor int
	// InstanceID is this process's static group membership id
	// (group.instance.id, KIP-345): stable across the instance's restarts and
	// unique among the running instances of a role (a pod name). With it, a
	// restarted instance takes its partitions back at once, without a
	// rebalance and without waiting out the session timeout. Empty: dynamic
	// membership.
	InstanceID string
	// SessionTimeout is how long the group coordinator waits for a silent
	// member before giving its partitions to the others (a killed instance
	// that does not come back). Defaults to DefaultSessionTimeout.
	SessionTimeout time.Duration
	// Faults says the role's Kafka faults (fetch errors of its poll loops)
	// at most once a minute each and tells the role's Health of them; the
	// commands set it to Health.Faults(). Nil: a process-wide FaultLog,
	// rate-limited alike but unmeasured.
	Faults *FaultLog
	// Wire counts the requests, batches and records of every client
	// ClientOpts makes (franz-go hooks); the commands set it to
	// Health.Wire(). Nil: not counted.
	Wire *Wire
}

// DefaultSessionTimeout is the group session timeout of every role: a killed
// instance's partitions move to the others after at most this long (Kafka's
// own default, 45 s, would hold them more than seven times as long). It is
// the brokers' default group.min.session.timeout.ms; heartbeats go every
// 2 s. With InstanceID set, a restarted instance does not wait for it.
const DefaultSessionTimeout = 6 * time.Second

// GroupOpts returns the options every group member of the pipeline uses:
// the group, static membership when InstanceID is set, the session timeout,
// and the cooperative-sticky balancer (incremental rebalances: partitions
// that stay with a member are not revoked when another joins or leaves).
func (c Config) GroupOpts(group string) []kgo.Opt {
	st := c.SessionTimeout
	if st <= 0 {
		st = DefaultSessionTimeout
	}
	opts := []kgo.Opt{
		kgo.ConsumerGroup(group),
		kgo.SessionTimeout(st),
		kgo.HeartbeatInterval(min(3*time.Second, st/3)),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
	}
	if c.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(c.InstanceID))
	}
	return opts
}

// Topics returns the topic names of this configuration.
func (c Config) Topics() Topics { return TopicsFor(c.TopicPrefix) }

// Validate checks the configuration once; errors name the offending setting.
func (c Config) Validate() error {
	switch strings.ToUpper(c.SASLMechanism) {
	case SASLNone:
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if c.SASLUser == "" {
			return errors.New("kafka: --kafka-user is required with --kafka-sasl")
		}
	default:
		return fmt.Errorf("kafka: --kafka-sasl %q is not supported; accepted: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or empty", c.SASLMechanism)
	}
	if c.Partitions < 1 {
		return fmt.Errorf("kafka: --partitions must be ≥ 1, got %d", c.Partitions)
	}
	if c.EmbeddedPort < 0 || c.EmbeddedPort > 65535 {
		return fmt.Errorf("kafka: --embedded-kafka-port must be within 0–65535, got %d", c.EmbeddedPort)
	}
	if c.SessionTimeout != 0 && (c.SessionTimeout < 6*time.Second || c.SessionTimeout > 300*time.Second) {
		return fmt.Errorf("kafka: --session-timeout must be within 6s–300s (the brokers' default group.min/max.session.timeout.ms), got %s", c.SessionTimeout)
	}
	if len(c.InstanceID) > 249 {
		return fmt.Errorf("kafka: --instance-id must be at most 249 bytes, got %d", len(c.InstanceID))
	}
	for _, b := range c.Brokers {
		if !strings.Contains(b, ":") {
			return fmt.Errorf("kafka: broker %q must be host:port", b)
		}
	}
	if c.Embedded && len(c.Brokers) > 0 {
		return fmt.Errorf("kafka: --brokers (%s) and --embedded-kafka exclude each other: set one", strings.Join(c.Brokers, ","))
	}
	if c.EmbeddedPort != 0 && !c.Embedded {
		return errors.New("kafka: --embedded-kafka-port needs --embedded-kafka")
	}
	return nil
}

// ErrNoBrokers is returned (wrapped) by RequireBrokers and Ready when neither
// brokers nor the embedded broker are configured.
var ErrNoBrokers = errors.New("no Kafka brokers configured")

// RequireBrokers reports, with ErrNoBrokers, a configuration that names no
// Kafka to use: neither Brokers nor Embedded. The message names the flag
// and the explicit alternative.
func (c Config) RequireBrokers() error {
	if len(c.Brokers) == 0 && !c.Embedded {
		return fmt.Errorf("%w: set --brokers host:port,… or pass --embedded-kafka to run on an in-process broker (in memory, NOT durable)", ErrNoBrokers)
	}
	return nil
}

// ClientOpts returns the franz-go options for connecting with this
// configuration; roles append their own (group, transactions, …).
func (c Config) ClientOpts() ([]kgo.Opt, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if len(c.Brokers) == 0 {
		return nil, errors.New("kafka: no brokers configured")
	}
	opts, err := kafkaconn.Opts(c.Brokers, c.SASL(), c.TLSSettings())
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	return append(opts, c.Wire.Hooks()...), nil
}

// SASL returns c's authentication settings.
func (c Config) SASL() kafkaconn.SASL {
	return kafkaconn.SASL{Mechanism: c.SASLMechanism, User: c.SASLUser, Password: c.SASLPassword}
}

// TLSSettings returns c's encryption settings.
func (c Config) TLSSettings() kafkaconn.TLS {
	return kafkaconn.TLS{Enabled: c.TLS, CAFile: c.TLSCAFile, InsecureSkipVerify: c.TLSInsecure}
}

// newClient returns a client of c for one short task (what, as its errors
// name it).
func (c Config) newClient(what string) (*kgo.Client, error) {
	opts, err := c.ClientOpts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: %s: %w", what, err)
	}
	return cl, nil
}

// EnsureTopics creates the topics (All) when they do not exist yet; the
// parked topic is compacted (its key is the report id, and only each
// report's last state counts).
func EnsureTopics(ctx context.Context, c Config) error {
	cl, err := c.newClient("new admin client")
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	t := c.Topics()
	compact := "compact"
	for _, create := range []struct {
		configs map[string]*string
		topics  []string
	}{{nil, t.Ledger()}, {map[string]*string{"cleanup.policy": &compact}, []string{t.Parked}}} {
		resp, err := adm.CreateTopics(ctx, int32(c.Partitions), int16(c.ReplicationFactor), create.configs, create.topics...)
		if err != nil {
			return fmt.Errorf("kafka: create topics: %w", err)
		}
		for _, r := range resp.Sorted() {
			if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
				return fmt.Errorf("kafka: create topic %s: %w", r.Topic, r.Err)
			}
		}
	}
	return nil
}

// Ping checks that the brokers answer (a metadata request), for readiness probes.
func Ping(ctx context.Context, c Config) error {
	cl, err := c.newClient("ping")
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := cl.Ping(ctx); err != nil {
		return fmt.Errorf("kafka: ping: %w", err)
	}
	return nil
}

// HasHeader reports whether r carries a header named key (for example
// schemas.HeaderLease: the reporter's lease markers, which readers of the
// deliveries topic skip).
func HasHeader(r *kgo.Record, key string) bool {
	for _, h := range r.Headers {
		if h.Key == key {
			return true
		}
	}
	return false
}

// DefaultLeaveTimeout bounds leaving the group when a role's client closes.
const DefaultLeaveTimeout = 5 * time.Second

// CloseClient closes cl within about 2×d (d: DefaultLeaveTimeout when ≤ 0),
// whatever the broker does. kgo's Close leaves the group first and waits for
// the group's management loop, whose JoinGroup or LeaveGroup request to a
// frozen coordinator only times out after the rebalance timeout plus the
// request overhead (70 s by default: a role's exit took 70–90 s with the
// broker stopped). So the leave gets d, and Close runs in a goroutine given
// another d; past that CloseClient returns and leaves Close to finish in the
// background — it is called on the way out of a role, whose process exit
// ends it, and by the enricher as one of its Kafka sessions ends (Close then
// finishes in the background; the next session removes the old member
// should its leave not have got through). The broker drops a member that
// did not leave after its session timeout, as for a killed instance.
func CloseClient(cl *kgo.Client, d time.Duration) {
	if d <= 0 {
		d = DefaultLeaveTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	_ = cl.LeaveGroupContext(ctx)
	cancel()
	done := make(chan struct{})
	go func() { // owned by the process's exit past d (see above)
		cl.Close()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}
