package sandbox

import "strings"

// blockedAgents are the product tokens (case-insensitive, the part before the
// first "/" or space) of the default User-Agents of command-line tools and
// HTTP libraries that the edge layer answers with 403 and edge error 1010.
var blockedAgents = map[string]bool{
	"go-http-client":    true,
	"curl":              true,
	"wget":              true,
	"python-requests":   true,
	"python-urllib":     true,
	"python-urllib3":    true,
	"python-httpx":      true,
	"aiohttp":           true,
	"httpie":            true,
	"okhttp":            true,
	"axios":             true,
	"node-fetch":        true,
	"node":              true,
	"undici":            true,
	"got":               true,
	"java":              true,
	"apache-httpclient": true,
	"jakarta":           true,
	"libwww-perl":       true,
	"lwp::simple":       true,
	"ruby":              true,
	"faraday":           true,
	"guzzlehttp":        true,
	"php":               true,
	"dart":              true,
	"reqwest":           true,
	"hyper":             true,
	"rest-client":       true,
	"powershell":        true,
	"winhttp":           true,
	"postmanruntime":    true,
	"insomnia":          true,
	"http.rb":           true,
	"scrapy":            true,
	"libcurl":           true,
}

// EdgeBlocked reports whether the edge layer blocks this User-Agent: an empty
// (or blank) one, or one whose product token is a default tool or library
// agent (Go-http-client/…, curl/…, python-requests/…, Wget/…, okhttp/…,
// axios/…, node-fetch/…, Java/…, …).
func EdgeBlocked(ua string) bool {
	ua = strings.TrimSpace(ua)
	if ua == "" {
		return true
	}
	prod := ua
	if i := strings.IndexAny(prod, "/ ("); i >= 0 {
		prod = prod[:i]
	}
	return blockedAgents[strings.ToLower(prod)]
}

// edgeBody is the edge layer's answer, modelled on a CDN's browser-integrity
// block: plain text naming the edge error code.
const edgeBody = "error code: 1010"
