package partnerapi

import "strings"

// applePlatforms are the platforms that get the iOS HLS rendition first.
var applePlatforms = map[string]bool{
	"ios": true, "ipados": true, "macos": true, "tvos": true, "watchos": true,
	"visionos": true, "iphoneos": true, "darwin": true,
}

// isApple reports whether platform (an OS name such as "iOS", "iPadOS 17.4"
// or "android") is an Apple platform: its leading letters, case-insensitive.
func isApple(platform string) bool {
	p := strings.TrimSpace(platform)
	end := 0
	for end < len(p) {
		b := p[end] | 0x20
		if b < 'a' || b > 'z' {
			break
		}
		end++
	}
	return applePlatforms[strings.ToLower(p[:end])]
}

// StreamCandidates lists the stream URLs of m to try in order (spec, endpoint
// 8): on Apple platforms ios_hls_url, elsewhere android_hls_url (or its
// legacy alias hls_url); then the other HLS field; then the MP3 url. Empty
// and duplicate entries are skipped (standby may point all three HLS fields
// at one rendition, or at the MP3 itself).
func StreamCandidates(m Mix, platform string) []string {
	var order [4]string
	if isApple(platform) {
		order = [4]string{m.IOSHLSURL, m.AndroidHLSURL, m.HLSURL, m.URL}
	} else {
		order = [4]string{m.AndroidHLSURL, m.HLSURL, m.IOSHLSURL, m.URL}
	}
	out := make([]string, 0, 4)
next:
	for _, u := range order {
		if strings.TrimSpace(u) == "" {
			continue
		}
		for _, seen := range out {
			if seen == u {
				continue next
			}
		}
		out = append(out, u)
	}
	return out
}
