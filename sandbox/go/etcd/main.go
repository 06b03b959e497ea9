// An etcd server for the test world: go.etcd.io/etcd/server/v3's embed package behind
// the few flags kube-apiserver's storage needs. etcd's own main module pins its sibling
// modules with `replace`, so it cannot be built with `go install …@version`; this can.
package main

import (
	"flag"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "", "directory for etcd's data (required)")
	clientURL := flag.String("listen-client-urls", "http://127.0.0.1:2379", "URL clients connect to")
	peerURL := flag.String("listen-peer-urls", "http://127.0.0.1:2380", "URL for peer traffic (unused: one member)")
	flag.Parse()
	if *dataDir == "" {
		log.Fatal("etcd: --data-dir is required")
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.Name = "raysize-test"
	cfg.LogLevel = "error"
	must := func(raw string) url.URL {
		u, err := url.Parse(raw)
		if err != nil {
			log.Fatalf("etcd: bad URL %q: %v", raw, err)
		}
		return *u
	}
	cfg.ListenClientUrls = []url.URL{must(*clientURL)}
	cfg.AdvertiseClientUrls = cfg.ListenClientUrls
	cfg.ListenPeerUrls = []url.URL{must(*peerURL)}
	cfg.AdvertisePeerUrls = cfg.ListenPeerUrls
	cfg.InitialCluster = cfg.Name + "=" + *peerURL
	// kube-apiserver asks for progress notifications (watch bookmarks, consistent reads)
	cfg.WatchProgressNotifyInterval = 5e9
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("etcd: %v", err)
	}
	defer e.Close()
	<-e.Server.ReadyNotify()
	log.Printf("etcd: ready on %s", *clientURL)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stop:
	case err := <-e.Err():
		log.Fatalf("etcd: %v", err)
	}
}
