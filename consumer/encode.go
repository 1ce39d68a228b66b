package consumer

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"github.com/playpipe/playpipe/schemas"
)

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
