// scripts/check-artifacts, install_crdcheck(): copied into a Go module of its own and built once.
// crdcheck reads multi-document YAML on stdin and strictly decodes every
// ServiceMonitor, PrometheusRule and ScaledObject into its Go API type.
package main

import (
	"bytes"
	"fmt"
	"io"
	"os"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
	bad, seen := 0, 0
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil || meta.Kind == "" {
			continue
		}
		var target any
		switch meta.APIVersion + "/" + meta.Kind {
		case "monitoring.coreos.com/v1/ServiceMonitor":
			target = &monitoringv1.ServiceMonitor{}
		case "monitoring.coreos.com/v1/PrometheusRule":
			target = &monitoringv1.PrometheusRule{}
		case "keda.sh/v1alpha1/ScaledObject":
			target = &kedav1alpha1.ScaledObject{}
		default:
			continue
		}
		seen++
		if err := yaml.UnmarshalStrict(doc, target); err != nil {
			fmt.Printf("%s/%s: %v\n", meta.Kind, meta.Metadata.Name, err)
			bad++
			continue
		}
		fmt.Printf("%s/%s: ok\n", meta.Kind, meta.Metadata.Name)
	}
	if bad > 0 || seen == 0 {
		fmt.Printf("%d of %d custom resources failed\n", bad, seen)
		os.Exit(1)
	}
}
