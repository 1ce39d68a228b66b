package main

import (
	"context"
	"log/slog"
	"os"

	"go.opentelemetry.io/otel/metric"

	"github.com/playpipe/playpipe/internal/kafkax"
)

// exitBrokerChanged is the exit status of a role whose Kafka came back
// different (a topic re-created, a broker restarted empty, another
// cluster): EX_TEMPFAIL, "try again". Its supervisor (Kubernetes, systemd,
// compose's restart policy) starts it again with fresh clients, which
// resolve the new topic ids and begin from the new topics' committed
// offsets — none on a new topic, so from its start. docs/operating.md says
// why a role exits rather than heal in place.
const exitBrokerChanged = 75

// exitProcess ends the process; a variable so that a test can see the call.
var exitProcess = os.Exit

// startKafkaHealth starts the background probe of kcfg's brokers
// (kafkax.Health: /readyz answers from it, never waiting on the broker) and
// returns kcfg with its FaultLog set, so that the role's poll loops say
// their fetch errors at most once a minute, and its Wire, so that the
// role's Kafka requests are counted (playpipe_kafka_requests_total, …). When the broker comes back
// different, the process exits at once with exitBrokerChanged — without a
// graceful shutdown, which could commit offsets of the old topic onto the
// new one: the exit is a crash as far as Kafka is concerned, and every role
// is built to survive a crash without loss. stop ends the probe. role
// names the topics the probe checks are writable (roleWrites).
func startKafkaHealth(ctx context.Context, role string, kcfg kafkax.Config, mp metric.MeterProvider, log *slog.Logger) (*kafkax.Health, kafkax.Config, func(), error) {
	h, err := kafkax.NewHealth(kcfg, kafkax.HealthOptions{Logger: log, MeterProvider: mp, Writes: roleWrites(role, kcfg.Topics())})
	if err != nil {
		return nil, kcfg, nil, err
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { // owned by stop: ends when hctx ends
		defer close(done)
		h.Run(hctx)
	}()
	go func() { // owned by stop: ends when hctx ends, or ends the process
		select {
		case <-h.Changed():
			log.Error("kafka: exiting for the supervisor to restart this role with fresh Kafka clients; nothing more is committed on the way out",
				"exit_status", exitBrokerChanged, "cause", h.ChangedBy())
			exitProcess(exitBrokerChanged)
		case <-hctx.Done():
		}
	}()
	kcfg.Faults, kcfg.Wire = h.Faults(), h.Wire()
	return h, kcfg, func() { cancel(); <-done }, nil
}

// roleWrites are the topics role writes with acks=all: while a partition of
// one has no leader or fewer in-sync replicas than min.insync.replicas
// (brokers down), the role's writes fail, and /readyz says not ready
// (docs/operating.md). The sink writes no topic: it reads what is there.
func roleWrites(role string, t kafkax.Topics) []string {
	switch role {
	case "ingest":
		return []string{t.Events}
	case "consume":
		return []string{t.Reports, t.Rejected}
	case "report":
		return []string{t.Deliveries, t.Parked}
	}
	return nil
}
