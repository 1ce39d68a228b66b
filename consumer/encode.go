package consumer

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"github.com/playpipe/playpipe/internal/jsonenc"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
)

// AppendTrackPlay appends the JSON encoding of p to dst and returns it. The
// bytes are identical to encoding/json's json.Marshal(p) (same field order,
// omitempty rules and string escaping, HTML characters included); the tests
// hold it to that. It allocates only when dst must grow.
func AppendTrackPlay(dst []byte, p *schemas.TrackPlay) []byte {
	return appendTrackPlay(dst, p, p.ReportID)
}

// appendTrackPlay encodes p with reportID in place of p.ReportID (the hot
// path keeps the id in its byte arena instead of a string per play).
func appendTrackPlay[ID []byte | string](dst []byte, p *schemas.TrackPlay, reportID ID) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(p.V), 10)
	dst = append(dst, `,"report_id":`...)
	dst = jsonenc.AppendString(dst, reportID)
	dst = append(dst, `,"event_id":`...)
	dst = jsonenc.AppendString(dst, p.EventID)
	dst = append(dst, `,"mix_id":`...)
	dst = strconv.AppendInt(dst, p.MixID, 10)
	dst = append(dst, `,"position":`...)
	dst = strconv.AppendInt(dst, int64(p.Position), 10)
	dst = append(dst, `,"overlap_ms":`...)
	dst = strconv.AppendInt(dst, p.OverlapMS, 10)
	if p.BelowMinimum {
		dst = append(dst, `,"below_minimum":true`...)
	}
	if p.NoUserID {
		dst = append(dst, `,"no_user_id":true`...)
	}
	if p.StandbyListing {
		dst = append(dst, `,"standby_listing":true`...)
	}
	dst = append(dst, `,"derived_at":`...)
	dst = strconv.AppendInt(dst, p.DerivedAt, 10)
	dst = append(dst, `,"report":`...)
	dst = partnerapi.AppendReportJSON(dst, &p.Report)
	return append(dst, '}')
}

// appendReportID appends schemas.ReportID(eventID, position) as hex bytes,
// without allocating; the tests hold the two equal.
func appendReportID(dst []byte, eventID string, position int) []byte {
	var buf [schemas.MaxEventIDLen + 24]byte
	var sum [sha256.Size]byte
	if len(eventID) > schemas.MaxEventIDLen {
		return append(dst, schemas.ReportID(eventID, position)...)
	}
	b := append(buf[:0], eventID...)
	b = append(b, 0)
	b = strconv.AppendInt(b, int64(position), 10)
	sum = sha256.Sum256(b)
	return hex.AppendEncode(dst, sum[:16])
}
