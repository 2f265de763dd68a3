"""Card templates (packaged as certify._templates)."""
