from django.contrib import admin
from django.urls import path

from chat import views
from chat.admin_views import latency_view

urlpatterns = [
    path("", views.index, name="index"),
    path("api/conversations/", views.conversations, name="conversations"),
    path("api/conversations/<int:conversation_id>/", views.conversation, name="conversation"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics, name="metrics"),
    path("admin/latency/", admin.site.admin_view(latency_view), name="admin-latency"),
    path("admin/", admin.site.urls),
]
