package replay

import (
	"context"
	"time"

	"github.com/playpipe/playpipe/internal/kafkax"
)

// DefaultKafkaTimeout is Config.KafkaTimeout's default.
const DefaultKafkaTimeout = 30 * time.Second

// KafkaTimeoutError is the error of a run that waited on Kafka longer than
// Config.KafkaTimeout: a broker that does not answer (frozen, cut off)
// ends the run instead of holding it forever. Nothing is lost: every answer
// the run got is on record or the report is posted again by a re-run of
// the same id, labelled in doubt. The same type as the reporter's
// (kafkax.TimeoutError): one reader of a log's end for both.
type KafkaTimeoutError = kafkax.TimeoutError

// waits bounds each wait of a run on Kafka by timeout.
type waits struct {
	timeout time.Duration
	brokers []string
}

// kafka is w as the shared bound (kafkax.Waits): its errors say "replay"
// and --kafka-timeout.
func (w waits) kafka() kafkax.Waits {
	return kafkax.Waits{Timeout: w.timeout, Brokers: w.brokers, Role: "replay", Setting: "--kafka-timeout"}
}

// do runs one step against Kafka bounded by the timeout (kafkax.Waits.Do):
// past it, a *KafkaTimeoutError naming the step.
func (w waits) do(ctx context.Context, step string, fn func(context.Context) error) error {
	return w.kafka().Do(ctx, step, fn)
}
