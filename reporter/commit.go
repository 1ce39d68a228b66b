package reporter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/playpipe/playpipe/internal/kafkax"
)

// Commits carry each partition's progress in the offset commit's metadata
// (progress.go): the commit point, which later offsets are already final,
// which are in doubt, and where the deliveries log continues. franz-go's
// commit API writes its own metadata, so the reporter sends the
// OffsetCommit requests itself, as the group member it is.

// commitPace paces the periodic commits: one in flight at a time, at most
// one per CommitInterval. The coordinator goroutine owns it: no lock.
type commitPace struct {
	inFlight bool
	last     time.Time
}

// commitState is what the progress snapshots remember between commits:
// its own lock (progressOf runs in the poller and the coordinator).
type commitState struct {
	mu       sync.Mutex
	tooLarge map[tpKey]bool // partitions warned about: progress over MetadataMaxBytes
}

// commitEntry is one partition's offset and progress to commit.
type commitEntry struct {
	ps     *partState
	offset int64
	epoch  int32
	meta   string
}

// periodicCommit returns the progress to commit now, if pace allows (pace
// is the coordinator's).
func (rn *run) periodicCommit(pace *commitPace) []commitEntry {
	now := rn.cfg.Now()
	if rn.noCommit.Load() || pace.inFlight || now.Sub(pace.last) < rn.cfg.CommitInterval {
		return nil
	}
	batch := rn.dirtyProgress()
	if len(batch) > 0 {
		pace.inFlight, pace.last = true, now
	}
	return batch
}

// markDirty marks parts changed since their last commit: committed again
// with the next one (a periodic commit that failed, or every partition at
// shutdown).
func (rn *run) markDirty(parts []*partState) {
	for _, ps := range parts {
		ps.mu.Lock()
		ps.dirty = true
		ps.mu.Unlock()
	}
}

// dirtyProgress snapshots the progress of the partitions that changed since
// the last commit and clears their dirty marks: each partition's snapshot
// under its own lock (their progresses are independent).
func (rn *run) dirtyProgress() []commitEntry {
	var batch []commitEntry
	for _, ps := range rn.partList() {
		ps.mu.Lock()
		if ps.dirty && !ps.dropped.Load() {
			ps.dirty = false
			if e, ok := rn.progressOf(ps); ok {
				batch = append(batch, e)
			}
		}
		ps.mu.Unlock()
	}
	return batch
}

// progressOf snapshots one partition's progress (ps.mu held): the tracker,
// the unsure set, the recovered states and the log position, read together.
// ok is false when there is nothing to commit, or when the progress does
// not fit the broker's metadata bound: the previous commit then stays,
// which is safe (its log position is older, so a restart reads a longer
// tail).
func (rn *run) progressOf(ps *partState) (commitEntry, bool) {
	base, epoch, ok := ps.wm.commitPoint()
	if !ok {
		base, epoch = ps.start, -1
	}
	p := progress{Base: base, LogPartition: ps.logPart, LogOffset: ps.logEnd}
	if h := ps.slow.held(); h > 0 {
		// A slow retry's answer is on its way (slowlane.go): the next owner
		// must read it, so the log position stays before it.
		p.LogOffset = min(p.LogOffset, h)
	}
	p.Done = ps.wm.appendDone(nil)
	for j := range ps.unsure {
		if j.rec.Offset >= base {
			p.Doubt = append(p.Doubt, j.rec.Offset)
		}
	}
	// What the previous owner left about offsets not fetched yet stays.
	unfetched := len(p.Done)
	for o, st := range ps.recovered {
		if o < base {
			continue
		}
		if st == recFinal {
			p.Done = append(p.Done, o)
		} else {
			p.Doubt = append(p.Doubt, o)
		}
	}
	if len(p.Done) > unfetched {
		slices.Sort(p.Done)
	}
	slices.Sort(p.Doubt)
	p.Doubt = slices.Compact(p.Doubt)
	meta := encodeProgress(&p)
	rn.commits.mu.Lock()
	defer rn.commits.mu.Unlock()
	if len(meta) > rn.cfg.MetadataMaxBytes {
		if !rn.commits.tooLarge[ps.key] {
			if rn.commits.tooLarge == nil {
				rn.commits.tooLarge = map[tpKey]bool{}
			}
			rn.commits.tooLarge[ps.key] = true
			rn.log.Warn("partition progress larger than --offset-metadata-max-bytes: keeping the previous commit until it shrinks (a restart reads a longer deliveries tail)",
				"partition", ps.key.partition, "bytes", len(meta), "max", rn.cfg.MetadataMaxBytes, "done", len(p.Done), "doubt", len(p.Doubt))
		}
		return commitEntry{}, false
	}
	delete(rn.commits.tooLarge, ps.key)
	return commitEntry{ps: ps, offset: base, epoch: epoch, meta: meta}, true
}

// commit sends one OffsetCommit of batch as this group member and returns
// the partitions whose commit failed (all of them on a request error).
func (rn *run) commit(ctx context.Context, why string, batch []commitEntry) (failed []*partState) {
	member, gen := rn.cl.GroupMetadata()
	if member == "" || gen < 0 {
		rn.log.Debug("offset commit skipped: not in the group yet", "why", why)
		return partsOf(batch)
	}
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group = rn.cfg.Group
	req.Generation = gen
	req.MemberID = member
	if id := rn.cfg.Kafka.InstanceID; id != "" {
		req.InstanceID = &id
	}
	t := kmsg.NewOffsetCommitRequestTopic()
	t.Topic = rn.topics.Reports
	t.TopicID = rn.reportsID
	byPart := make(map[int32]*partState, len(batch))
	for _, e := range batch {
		p := kmsg.NewOffsetCommitRequestTopicPartition()
		p.Partition = e.ps.key.partition
		p.Offset = e.offset
		p.LeaderEpoch = e.epoch
		p.Metadata = kmsg.StringPtr(e.meta)
		t.Partitions = append(t.Partitions, p)
		byPart[p.Partition] = e.ps
	}
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, rn.cl)
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			// At most a line a minute: commits go every 100 ms and fail
			// alike while a broker or the group coordinator is away.
			rn.cfg.Kafka.Faults.Say(rn.log, slog.LevelWarn, kafkax.FaultCommit, rn.topics.Reports,
				"offset commit failed (retried with the next commit; the previous progress stays valid)", "why", why, "err", err)
		}
		return partsOf(batch)
	}
	answered := 0
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			answered++
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				rn.cfg.Kafka.Faults.Say(rn.log, slog.LevelWarn, kafkax.FaultCommit, fmt.Sprintf("%s[%d]", rn.topics.Reports, rp.Partition),
					"offset commit failed for a partition", "why", why, "partition", rp.Partition, "err", err)
				if ps := byPart[rp.Partition]; ps != nil {
					failed = append(failed, ps)
				}
			}
		}
	}
	if answered < len(batch) {
		rn.log.Warn("offset commit answer misses partitions", "why", why, "asked", len(batch), "answered", answered)
		return partsOf(batch)
	}
	return failed
}

func partsOf(batch []commitEntry) []*partState {
	out := make([]*partState, len(batch))
	for i, e := range batch {
		out[i] = e.ps
	}
	return out
}
