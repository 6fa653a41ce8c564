package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// startAttempts bounds the retries of a start whose port another process took between freePort and etcd's bind.
const startAttempts = 5

// startEtcd runs a single-member etcd inside this process, on 127.0.0.1 only, storing data under dir. etcd binds
// its listeners from URLs, so its ports are picked free and released first; when another process takes one in that
// window (many control planes start side by side in a test run), the start is repeated on fresh ports and a fresh
// data directory.
func startEtcd(dir string) (*embed.Etcd, string, error) {
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		var e *embed.Etcd
		var clientURL string
		e, clientURL, err = startEtcdOnce(filepath.Join(dir, fmt.Sprintf("attempt-%d", attempt)))
		if err == nil {
			return e, clientURL, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, "", err
		}
	}
	return nil, "", fmt.Errorf("%w (after %d attempts on fresh ports)", err, startAttempts)
}

func startEtcdOnce(dir string) (*embed.Etcd, string, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	clientURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	peerURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}

	cfg := embed.NewConfig()
	cfg.Name = "testenv"
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	// The data lives in a temporary directory removed on exit: durability buys nothing here and fsync costs a lot.
	cfg.UnsafeNoFsync = true

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, "", fmt.Errorf("etcd failed: %w", err)
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, "", fmt.Errorf("etcd not ready after 60s")
	}
	return e, clientURL.String(), nil
}

// freePort asks the kernel for a free port on the loopback interface. etcd binds its own listeners from URLs, so the
// port is released before etcd takes it; startEtcd repeats a start that lost the port in that window.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
