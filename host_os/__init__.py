"""host_os"""
