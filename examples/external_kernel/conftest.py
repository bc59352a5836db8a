# Only needed when pytest's plugin autoload is off (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1);
# otherwise the installed mhc-parity registers the plugin itself (this line is then a no-op).
pytest_plugins = ["mhc_parity.harness.pytest_plugin"]
