"""Container images built without a container engine (`make image`): reproducible layers
(`layers`), OCI archives (`oci`), Debian's packages (`debian`), the locked wheels (`python`),
and the two images the chart runs (`build`)."""
