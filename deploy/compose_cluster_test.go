package deploy_test

import (
	"encoding/xml"
	"slices"
	"strings"
	"testing"
)

// clusterXML is what the test reads of deploy/clickhouse/cluster.xml.
type clusterXML struct {
	Remote struct {
		Clusters []struct {
			XMLName xml.Name
			Shards  []struct {
				Internal bool `xml:"internal_replication"`
				Replicas []struct {
					Host string `xml:"host"`
					Port string `xml:"port"`
				} `xml:"replica"`
			} `xml:"shard"`
		} `xml:",any"`
	} `xml:"remote_servers"`
	Macros struct {
		Shard   string `xml:"shard"`
		Replica struct {
			FromEnv string `xml:"from_env,attr"`
		} `xml:"replica"`
	} `xml:"macros"`
	ZooKeeper struct {
		Nodes []struct {
			Host string `xml:"host"`
			Port string `xml:"port"`
		} `xml:"node"`
	} `xml:"zookeeper"`
	DDL struct {
		Path string `xml:"path"`
	} `xml:"distributed_ddl"`
}

// TestComposeClusterProfile: the replicated ledger of the compose file
// (profile cluster) is consistent with deploy/clickhouse/cluster.xml: the
// cluster the roles name is defined there, as one shard with internal
// replication whose replicas are the replica services, each naming itself
// in the {replica} macro; the ZooKeeper node is the keeper service; the
// cluster's sink has a consumer group of its own (sharing the single-server
// sink's would split the topics between the two ledgers).
func TestComposeClusterProfile(t *testing.T) {
	p, err := loadCompose(repoFile(t, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cx clusterXML
	if err := xml.Unmarshal(repoFile(t, "deploy/clickhouse/cluster.xml"), &cx); err != nil {
		t.Fatalf("deploy/clickhouse/cluster.xml: %v", err)
	}
	env := func(svc, k string) string {
		s, ok := p.Services[svc]
		if !ok {
			t.Fatalf("service %s missing", svc)
		}
		if v := s.Environment[k]; v != nil {
			return *v
		}
		return ""
	}
	for _, svc := range []string{"keeper", "ch-1", "ch-2", "sink-cluster", "audit-cluster"} {
		if !slices.Contains(p.Services[svc].Profiles, "cluster") {
			t.Errorf("service %s is not in profile cluster: it would start with the default stack", svc)
		}
	}
	name := env("sink-cluster", "PLAYPIPE_CLICKHOUSE_CLUSTER")
	if name == "" || env("audit-cluster", "PLAYPIPE_CLICKHOUSE_CLUSTER") != name {
		t.Fatalf("PLAYPIPE_CLICKHOUSE_CLUSTER: sink-cluster %q, audit-cluster %q", name, env("audit-cluster", "PLAYPIPE_CLICKHOUSE_CLUSTER"))
	}
	var hosts []string
	found := false
	for _, c := range cx.Remote.Clusters {
		if c.XMLName.Local != name {
			continue
		}
		found = true
		if len(c.Shards) != 1 || !c.Shards[0].Internal {
			t.Errorf("cluster %s: %d shards (internal_replication %v); the ledger needs one shard with internal replication", name, len(c.Shards), len(c.Shards) > 0 && c.Shards[0].Internal)
		}
		for _, s := range c.Shards {
			for _, r := range s.Replicas {
				hosts = append(hosts, r.Host+":"+r.Port)
				if _, ok := p.Services[r.Host]; !ok {
					t.Errorf("cluster.xml replica %s is no compose service", r.Host)
				} else if got := env(r.Host, cx.Macros.Replica.FromEnv); got != r.Host {
					t.Errorf("service %s: %s=%q, want its own name (the {replica} macro)", r.Host, cx.Macros.Replica.FromEnv, got)
				}
			}
		}
	}
	if !found {
		t.Fatalf("cluster %s is not in cluster.xml's remote_servers", name)
	}
	if addr := env("sink-cluster", "PLAYPIPE_CLICKHOUSE_ADDR"); addr != strings.Join(hosts, ",") {
		t.Errorf("sink-cluster PLAYPIPE_CLICKHOUSE_ADDR %q, want every replica %q", addr, strings.Join(hosts, ","))
	}
	if cx.Macros.Shard == "" || cx.DDL.Path == "" || len(cx.ZooKeeper.Nodes) == 0 || cx.ZooKeeper.Nodes[0].Host != "keeper" {
		t.Errorf("cluster.xml: shard macro %q, distributed_ddl %q, zookeeper %+v", cx.Macros.Shard, cx.DDL.Path, cx.ZooKeeper.Nodes)
	}
	if g := env("sink-cluster", "PLAYPIPE_SINK_GROUP"); g == "" || g == env("sink", "PLAYPIPE_SINK_GROUP") || g == "playpipe-sink" {
		t.Errorf("sink-cluster's consumer group %q is the single-server sink's", g)
	}
}
