package expect

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
)

// Play is one expected report, by what the partner records of it.
type Play struct {
	TrackID, PlayedAt, PlayLength int64
	UserID, Device, ISRC          string
}

// Event splits one valid event (its JSON) into the plays it must yield and
// counts the overlaps under one second (below the default minimum: not
// reported, counted in the ledger).
func Event(cat *sandbox.Catalog, value []byte) (plays []Play, belowMin int, err error) {
	var ev struct {
		MixID      int64  `json:"mix_id"`
		StartedAt  int64  `json:"started_at"`
		OffsetMS   int64  `json:"offset_ms"`
		DurationMS int64  `json:"duration_ms"`
		UserID     string `json:"user_id"`
		Device     string `json:"device"`
	}
	if err := json.Unmarshal(value, &ev); err != nil {
		return nil, 0, fmt.Errorf("valid event does not decode: %w", err)
	}
	mix, ok := cat.Mix(ev.MixID)
	if !ok {
		return nil, 0, fmt.Errorf("valid event of unknown mix %d", ev.MixID)
	}
	end := min(ev.OffsetMS+ev.DurationMS, int64(mix.LengthSec)*1000)
	for _, tr := range mix.Tracks {
		s := int64(tr.StartSec) * 1000
		e := s + int64(tr.LengthSec)*1000
		overlap := min(e, end) - max(s, ev.OffsetMS)
		if overlap <= 0 {
			continue
		}
		if overlap < 1000 {
			belowMin++
			continue
		}
		plays = append(plays, Play{tr.ID, ev.StartedAt + max(0, s-ev.OffsetMS), overlap / 1000, ev.UserID, ev.Device, tr.ISRC})
	}
	return plays, belowMin, nil
}

// Sim is the expectation of a simulated fleet's messages: the plays their
// valid events must yield (with multiplicity), the overlaps under one second,
// and how many events were valid and bad.
func Sim(cat *sandbox.Catalog, msgs []simulator.Message) (posted map[Play]int, belowMin, valid, bad int, err error) {
	posted = map[Play]int{}
	for _, m := range msgs {
		if m.Kind != simulator.KindValid {
			bad++
			continue
		}
		valid++
		plays, below, err := Event(cat, m.Value)
		if err != nil {
			return nil, 0, 0, 0, fmt.Errorf("simulated event: %w", err)
		}
		belowMin += below
		for _, p := range plays {
			posted[p]++
		}
	}
	return posted, belowMin, valid, bad, nil
}

// Of is the Play of a report the sandbox accepted.
func Of(r sandbox.Report) Play {
	return Play{TrackID: r.TrackID, PlayedAt: r.PlayedAt, PlayLength: r.PlayLength, UserID: deref(r.UserID), Device: r.Device, ISRC: deref(r.ISRC)}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Diff returns the plays wanted more often than got (missing) and got more
// often than wanted (extra), each by time played.
func Diff(want, got map[Play]int) (missing, extra []Play) {
	for p, n := range want {
		for i := got[p]; i < n; i++ {
			missing = append(missing, p)
		}
	}
	for p, n := range got {
		for i := want[p]; i < n; i++ {
			extra = append(extra, p)
		}
	}
	byTime := func(a, b Play) int { return cmp.Compare(a.PlayedAt, b.PlayedAt) }
	slices.SortFunc(missing, byTime)
	slices.SortFunc(extra, byTime)
	return missing, extra
}

// First is the first of ps, or nil: an example for a failure message.
func First(ps []Play) any {
	if len(ps) == 0 {
		return nil
	}
	return ps[0]
}
