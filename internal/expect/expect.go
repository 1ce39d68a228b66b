// Package expect computes, independently of the consumer's code, the
// track plays a player event must yield under DESIGN.md's split rule, from
// the sandbox's own catalog: the oracle that end-to-end tests (pipeline/,
// e2e/, e2e/docker/) compare the partner's ledger with. Test support only.
package expect

import (
	"encoding/json"
	"fmt"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
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
