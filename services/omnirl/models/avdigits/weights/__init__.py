"""Data-only package: the shipped av-digits checkpoint (config.json + model.safetensors), a package so that
setuptools package-data ("*.json", "*.safetensors") ships it in wheels."""
