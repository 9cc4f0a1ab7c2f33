// cdi-validate loads CDI spec files with the CDI project's own Go library
// (tags.cncf.io/container-device-interface), as a container runtime does, and prints what it
// parsed: a JSON array on stdout, one object per file. Test tool for gpuop's generated specs.
//
// Usage: cdi-validate FILE...
//
// Each file is read with cdi.ReadSpec (strict decoding: unknown fields are errors; the
// declared cdiVersion must cover the fields used; names, device nodes, mounts and hooks are
// validated), then its directory is loaded through a cdi.Cache, as a runtime loads its spec
// directories, and each device's edits are listed with the spec's. Exit status 1 when any
// file or device fails, with the errors in the JSON and on stderr.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

type device struct {
	Name        string   `json:"name"`
	DeviceNodes []string `json:"deviceNodes"`
	Mounts      []string `json:"mounts"`
	Env         []string `json:"env"`
	Hooks       int      `json:"hooks"`
}

type result struct {
	File           string   `json:"file"`
	Kind           string   `json:"kind"`
	Version        string   `json:"cdiVersion"`
	MinimumVersion string   `json:"minimumVersion"`
	Devices        []device `json:"devices"`
	Errors         []string `json:"errors"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cdi-validate FILE...")
		os.Exit(2)
	}
	var results []result
	failed := false
	for _, file := range os.Args[1:] {
		r := check(file)
		if len(r.Errors) > 0 {
			failed = true
			for _, e := range r.Errors {
				fmt.Fprintf(os.Stderr, "%s: %s\n", file, e)
			}
		}
		results = append(results, r)
	}
	out, _ := json.MarshalIndent(results, "", "  ")
	fmt.Println(string(out))
	if failed {
		os.Exit(1)
	}
}

func check(file string) result {
	r := result{File: file, Devices: []device{}, Errors: []string{}}
	spec, err := cdi.ReadSpec(file, 0)
	if err != nil {
		r.Errors = append(r.Errors, err.Error())
		return r
	}
	r.Kind, r.Version = spec.Kind, spec.Version
	if minimum, err := specs.MinimumRequiredVersion(spec.Spec); err != nil {
		r.Errors = append(r.Errors, err.Error())
	} else {
		r.MinimumVersion = minimum
	}

	cache, err := cdi.NewCache(cdi.WithSpecDirs(filepath.Dir(file)), cdi.WithAutoRefresh(false))
	if err != nil {
		r.Errors = append(r.Errors, err.Error())
	}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			r.Errors = append(r.Errors, fmt.Sprintf("cache: %s: %v", path, e))
		}
	}
	names := cache.ListDevices()
	sort.Strings(names)
	for _, name := range names {
		found := cache.GetDevice(name)
		if found == nil || found.GetSpec().GetPath() != spec.GetPath() {
			continue // another file of the directory
		}
		// what a container requesting the device gets: its own edits and the spec's; the
		// runtime's injection would also stat the host's device nodes, which a test host lacks
		d := device{Name: name, DeviceNodes: []string{}, Mounts: []string{}, Env: []string{}}
		for _, edits := range []*specs.ContainerEdits{&found.ContainerEdits, &spec.ContainerEdits} {
			for _, node := range edits.DeviceNodes {
				d.DeviceNodes = append(d.DeviceNodes, node.Path)
			}
			for _, m := range edits.Mounts {
				d.Mounts = append(d.Mounts, fmt.Sprintf("%s:%s:%s", m.HostPath, m.ContainerPath,
					strings.Join(m.Options, ",")))
			}
			d.Env = append(d.Env, edits.Env...)
			d.Hooks += len(edits.Hooks)
		}
		r.Devices = append(r.Devices, d)
	}
	if len(r.Devices) == 0 && len(r.Errors) == 0 {
		r.Errors = append(r.Errors, "the cache resolved no device of this file")
	}
	return r
}
