package partnerapi

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ServedBy is the x-service-served-by header of an answer: empty for normal
// live service, "standby" or "live-bypass".
type ServedBy string

const (
	ServedLive       ServedBy = ""
	ServedStandby    ServedBy = "standby"
	ServedLiveBypass ServedBy = "live-bypass"
)

// Meta tells how an answer was served.
type Meta struct {
	Status   int
	ServedBy ServedBy
}

// Standby reports whether the answer came from the standby layer.
func (m Meta) Standby() bool { return m.ServedBy == ServedStandby }

// Track is one entry of a mix's track listing. ISRC is kept byte for byte.
type Track struct {
	ID     int64  `json:"id"`
	Time   string `json:"time"` // HH:MM:SS from the start of the mix
	ISRC   string `json:"isrc"`
	Artist string `json:"artist"`
	Title  string `json:"title"`
}

// DJ of a mix.
type DJ struct {
	Name           string `json:"name"`
	ImageLarge     string `json:"image_large"`
	ImageThumbnail string `json:"image_thumbnail"`
}

// Genre of a mix.
type Genre struct {
	ID          int64  `json:"id"`
	Title       string `json:"title"`
	Description string `json:"description"`
}

// Mix is GET /partners/mix/{id}. In standby Description may be empty, MinBPM
// may equal MaxBPM and the HLS fields may be degraded.
type Mix struct {
	ID             int64    `json:"id"`
	Title          string   `json:"title"`
	Description    string   `json:"description"`
	Length         string   `json:"length"` // HH:MM:SS
	MinBPM         int      `json:"min_bpm"`
	MaxBPM         int      `json:"max_bpm"`
	Explicit       FlexBool `json:"explicit"`
	URL            string   `json:"url"`
	AndroidHLSURL  string   `json:"android_hls_url"`
	IOSHLSURL      string   `json:"ios_hls_url"`
	HLSURL         string   `json:"hls_url"`
	ImageLarge     string   `json:"image_large"`
	ImageThumbnail string   `json:"image_thumbnail"`
	DJ             DJ       `json:"dj"`
	Tracks         []Track  `json:"tracks"`
	Genres         []Genre  `json:"genres"`
	Tags           []string `json:"tags"`
}

// FlexBool decodes a JSON boolean or the integers 0/1 (the list endpoint sends
// `explicit` as an integer live and as a boolean in standby). It encodes as a boolean.
type FlexBool bool

// UnmarshalJSON accepts true, false, 0, 1 and null (false).
func (b *FlexBool) UnmarshalJSON(data []byte) error {
	switch strings.TrimSpace(string(data)) {
	case "true", "1":
		*b = true
	case "false", "0", "null":
		*b = false
	default:
		return fmt.Errorf("partnerapi: boolean or 0/1 expected, got %.20s", data)
	}
	return nil
}

// ParseHMS parses a duration written HH:MM:SS (also MM:SS, and H with more
// than two digits) into milliseconds.
func ParseHMS(s string) (int64, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return 0, fmt.Errorf("partnerapi: duration %q is not HH:MM:SS", s)
	}
	var total int64
	for i, p := range parts {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n < 0 || p == "" || (i > 0 && n > 59) {
			return 0, fmt.Errorf("partnerapi: duration %q is not HH:MM:SS", s)
		}
		total = total*60 + n
	}
	return total * int64(time.Second/time.Millisecond), nil
}
