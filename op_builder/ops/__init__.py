"""One builder class per file; the registry imports every module here."""
