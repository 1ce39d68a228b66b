package main

import (
	"context"
	"fmt"
	"io"

	"github.com/playpipe/playpipe/internal/kafkax"
)

func init() {
	register(command{
		name:    "broker",
		summary: "run the embedded in-memory Kafka broker alone, in its own process (tests, try-outs)",
		hidden:  true,
		run:     runBroker,
	})
}

const brokerSynopsis = `Runs the embedded Kafka-protocol broker (kfake: in memory, NOT durable) on a loopback
port with the pipeline's topics, until SIGINT/SIGTERM. It is what --embedded-kafka starts
inside a role, in a process of its own, so that the broker can be frozen (SIGSTOP), killed
and started again empty while the roles run: the fault tests of docs/operating.md do.`

// runBroker serves the embedded broker until ctx ends.
func runBroker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("broker", stderr, brokerSynopsis)
	var lf logFlags
	port := fs.Int("port", 0, "loopback port (0: a free one; the address is printed)")
	prefix := fs.String("topic-prefix", kafkax.DefaultTopicPrefix, "prefix of the topic names created")
	partitions := fs.Int("partitions", 6, "partitions of the topics created")
	lf.register(fs.StringVar)
	log, err := parseLogged(fs, args, &lf, stderr)
	if err != nil {
		return err
	}
	e, err := kafkax.StartEmbeddedOn(*prefix, *partitions, *port)
	if err != nil {
		return err
	}
	defer e.Close()
	log.Warn("embedded Kafka broker serving (in memory, NOT durable)", "addrs", e.Addrs(), "topic_prefix", *prefix, "partitions", *partitions)
	fmt.Fprintf(stdout, "broker %s\n", e.Addrs()[0])
	<-ctx.Done()
	return nil
}
