package deploy_test

import (
	"strings"
	"testing"

	"github.com/playpipe/playpipe/testkit/kafkanode"
)

// TestKafkaVersionInStep: the Apache Kafka release the tests start
// (kafkanode.DefaultVersion), the one `make kafka` resolves (Makefile
// KAFKA_VERSION, deploy/kafka/pom.xml and tools-pom.xml) and the image docker-compose.yml runs
// are one release.
func TestKafkaVersionInStep(t *testing.T) {
	v := kafkanode.DefaultVersion
	for file, want := range map[string]string{
		"docker-compose.yml":   "image: apache/kafka:" + v + "\n",
		"Makefile":             "KAFKA_VERSION ?= " + v + "\n",
		"deploy/kafka/pom.xml": "<kafka.version>" + v + "</kafka.version>",
		// Kafka's own perf tools for bench-e2e's floor.
		"deploy/kafka/tools-pom.xml": "<kafka.version>" + v + "</kafka.version>",
	} {
		if !strings.Contains(string(repoFile(t, file)), want) {
			t.Errorf("%s does not say %q: the Kafka release is %s everywhere (kafkanode.DefaultVersion)", file, strings.TrimSpace(want), v)
		}
	}
}
