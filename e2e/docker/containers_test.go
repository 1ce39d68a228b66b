//go:build docker

package docker_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/go-connections/nat"
	"github.com/testcontainers/testcontainers-go"
	tcclickhouse "github.com/testcontainers/testcontainers-go/modules/clickhouse"
	"github.com/testcontainers/testcontainers-go/wait"
)

// composeImage returns the image docker-compose.yml uses for service (its
// `image:` line), so the suite and the compose stack never drift apart.
func composeImage(t *testing.T, prefix string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s+image:\s+(` + regexp.QuoteMeta(prefix) + `\S+)\s*$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("docker-compose.yml has no image %s…", prefix)
	}
	return string(m[1])
}

// freePort returns a TCP port free on this host now. The containers publish
// their ports on fixed host ports (not Docker's random ones) so that a
// restarted container keeps its address: the roles are configured once.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// bindPort publishes the container's port on hostPort.
func bindPort(containerPort nat.Port, hostPort int) testcontainers.CustomizeRequestOption {
	return testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
		if hc.PortBindings == nil {
			hc.PortBindings = nat.PortMap{}
		}
		hc.PortBindings[containerPort] = []nat.PortBinding{{HostIP: "0.0.0.0", HostPort: strconv.Itoa(hostPort)}}
	})
}

func daemonHost(ctx context.Context, t *testing.T) string {
	t.Helper()
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		t.Fatalf("docker: %v (this suite needs a Docker engine)", err)
	}
	defer p.Close()
	h, err := p.DaemonHost(ctx)
	if err != nil {
		t.Fatalf("docker: daemon host: %v (this suite needs a Docker engine)", err)
	}
	return h
}

// kafkaContainer is Apache Kafka (KRaft, one node that is broker and
// controller), configured like compose's, with an EXTERNAL listener on a
// fixed host port.
//
// The testcontainers kafka module (v0.40, the newest the module proxy
// serves here) starts only Confluent images (its start script sources
// /etc/confluent/docker/…), so Apache Kafka runs as a generic container.
type kafkaContainer struct {
	testcontainers.Container
	Broker string // host:port for the roles
}

func startKafka(ctx context.Context, t *testing.T) *kafkaContainer {
	t.Helper()
	host := daemonHost(ctx, t)
	port := freePort(t)
	ext := fmt.Sprintf("%d/tcp", port)
	ctr, err := testcontainers.Run(ctx, composeImage(t, "apache/kafka:"),
		testcontainers.WithEnv(map[string]string{
			"CLUSTER_ID":                                     "cGxheXBpcGUtZTJlLWRvYw", // 16 bytes, base64url: what kafka-storage format takes
			"KAFKA_NODE_ID":                                  "1",
			"KAFKA_PROCESS_ROLES":                            "broker,controller",
			"KAFKA_LISTENERS":                                fmt.Sprintf("PLAINTEXT://:9092,CONTROLLER://:9093,EXTERNAL://:%d", port),
			"KAFKA_ADVERTISED_LISTENERS":                     fmt.Sprintf("PLAINTEXT://localhost:9092,EXTERNAL://%s:%d", host, port),
			"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":           "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT",
			"KAFKA_CONTROLLER_LISTENER_NAMES":                "CONTROLLER",
			"KAFKA_CONTROLLER_QUORUM_VOTERS":                 "1@localhost:9093",
			"KAFKA_INTER_BROKER_LISTENER_NAME":               "PLAINTEXT",
			"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":         "1",
			"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
			"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":            "1",
			"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":         "0",
			"KAFKA_AUTO_CREATE_TOPICS_ENABLE":                "false",
		}),
		testcontainers.WithExposedPorts(ext),
		bindPort(nat.Port(ext), port),
		testcontainers.WithWaitStrategy(
			wait.ForListeningPort(nat.Port(ext)).WithStartupTimeout(2*time.Minute),
			wait.ForLog("Kafka Server started").WithStartupTimeout(2*time.Minute),
		),
	)
	testcontainers.CleanupContainer(t, ctr)
	if err != nil {
		t.Fatalf("kafka container: %v", err)
	}
	return &kafkaContainer{Container: ctr, Broker: net.JoinHostPort(host, strconv.Itoa(port))}
}

// clickHouseContainer is clickhouse/clickhouse-server at compose's version,
// its native port on a fixed host port.
type clickHouseContainer struct {
	*tcclickhouse.ClickHouseContainer
	Addr, User, Password, Database string
}

func startClickHouse(ctx context.Context, t *testing.T) *clickHouseContainer {
	t.Helper()
	port := freePort(t)
	c := &clickHouseContainer{User: "playpipe", Password: "e2e-docker-only", Database: "playpipe"}
	ctr, err := tcclickhouse.Run(ctx, composeImage(t, "clickhouse/clickhouse-server:"),
		tcclickhouse.WithUsername(c.User),
		tcclickhouse.WithPassword(c.Password),
		tcclickhouse.WithDatabase(c.Database),
		bindPort("9000/tcp", port),
	)
	testcontainers.CleanupContainer(t, ctr)
	if err != nil {
		t.Fatalf("clickhouse container: %v", err)
	}
	c.ClickHouseContainer = ctr
	if c.Addr, err = ctr.ConnectionHost(ctx); err != nil {
		t.Fatalf("clickhouse address: %v", err)
	}
	return c
}

// restart stops a container in order (its data survives) for down, then
// starts it again and waits for its wait strategy.
func restart(ctx context.Context, t *testing.T, c testcontainers.Container, what string, down time.Duration) {
	t.Helper()
	timeout := 20 * time.Second
	if err := c.Stop(ctx, &timeout); err != nil {
		t.Fatalf("stop %s: %v", what, err)
	}
	t.Logf("%s stopped", what)
	time.Sleep(down)
	if err := c.Start(ctx); err != nil {
		t.Fatalf("start %s: %v", what, err)
	}
	t.Logf("%s started again", what)
}
