package analytics

import (
	"context"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// generations is the reader's view of the topics' generations (KIP-516
// topic ids): the id of each topic in its latest fetch. A record is
// written with its own fetch's id; a rejection also with the events
// topic's id as the reader knows it when it copies the rejection (its
// source event's generation, src_topic_id: the consumer publishes a
// rejection right after reading its event, and a re-created events topic
// re-creates nothing of the old one's rejections). When a poll holds
// rejections and the events topic's id is not known yet (the sink's first
// fetches), the broker's metadata is asked, at most once a second — unless
// the broker's fetches carry no topic ids (Fetch below v13: Apache Kafka
// before 3.1). Its events' rows then have no id, so their rejections must
// have none either, although its metadata (v10 and later: 2.8 to 3.0) knows
// the topic's id.
type generations struct {
	adm              *kadm.Client
	events, rejected string
	ids              map[string]string
	log              *slog.Logger
	asked            time.Time
}

// see records the topic ids of a poll's fetches.
func (g *generations) see(ctx context.Context, fs kgo.Fetches) {
	rejections, recreated, events, withoutIDs := false, false, false, false
	for _, f := range fs {
		for _, ft := range f.Topics {
			if id := topicIDString(ft.TopicID); id != "" {
				if old, ok := g.ids[ft.Topic]; ok && old != id {
					g.log.Warn("sink: topic re-created (new topic id): its records are a new generation in the ledger",
						"topic", ft.Topic, "old_id", old, "new_id", id)
					recreated = true
				}
				g.ids[ft.Topic] = id
				events = events || ft.Topic == g.events
			}
			if ft.Topic == g.rejected && len(ft.Partitions) > 0 {
				rejections = true
				withoutIDs = withoutIDs || ft.TopicID == [16]byte{}
			}
		}
	}
	if recreated && !events {
		// Topics were created again and this poll holds none of the
		// events topic: its id is asked anew rather than assumed.
		delete(g.ids, g.events)
		g.asked = time.Time{}
	}
	if !rejections || withoutIDs || g.ids[g.events] != "" || time.Since(g.asked) < time.Second {
		return
	}
	g.asked = time.Now()
	mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	td, err := g.adm.ListTopics(mctx, g.events)
	if err != nil {
		g.log.Debug("sink: topic id of the events topic", "err", err)
		return
	}
	if d, ok := td[g.events]; ok && d.Err == nil {
		if id := topicIDString(d.ID); id != "" {
			g.ids[g.events] = id
		}
	}
}
